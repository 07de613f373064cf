#!/usr/bin/env bash
# For the forty-fifth session, any card (~300 s): issue 31's acceptance point never run yet, the conformance kit's
# full profile against the Flash Next demo daemon started as a user starts it (contexts past the demo's QSA
# budget), with DENSE_PREFIX and QSA's decode segments now on by default. Carry .whl .whl-test .devk.
. .dev/start.sh
bash .dev/demo_conformance.sh flashnext full flashnext; echo "conformance t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

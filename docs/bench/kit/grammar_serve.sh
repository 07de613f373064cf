#!/usr/bin/env bash
# The demo daemon on the H200 after issue 33's grammar changes: its full warm-up (the masked draw's
# variants before READY), conformance's quick profile (json rows among its samplings), and whether
# anything compiled while serving. Carry .whl .dev.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh > /dev/null 2>&1 || { echo install fails; exit 1; }
bash .dev/demo_conformance.sh "" quick demo; echo "t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# The next session's first device call: did the warm-up's fixes (152b8fd: the draw's per-row fields and
# prefill's strides unspecialized, prompts of every sorted block count with an indexer) leave nothing to
# compile while serving? The demo daemon (conformance's quick profile) and the Flash Next demo (its full
# profile), each through demo_conformance.sh; then issue 35 on one card (tp_one_card.sh, its bound now one rank's bf16
# error against fp32). Carry .whl .whl-test .dev .devcache-tp.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh > /dev/null 2>&1 || { echo install fails; exit 1; }
# the host's CPU alone (about 30 s): does llguidance's 32-lane fill spread over this host's cores (issue 33)?
PYTHONPATH=/tmp/site timeout 90 python .dev/grammar_threads.py 2>&1 | head -12; echo "t=$(el)"
bash .dev/demo_conformance.sh "" quick demo; echo "t=$(el)"
bash .dev/demo_conformance.sh flashnext full flashnext; echo "t=$(el)"
LIMIT=$(( 560 - $(el) )) bash .dev/tp_one_card.sh 2>&1 | tail -8 | cut -c1-300; echo "tp t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

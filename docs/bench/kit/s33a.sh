#!/usr/bin/env bash
# Thirty-third session's first call: issue 36 through HTTP on an H200 (resume_serve.sh: where the page-cache
# turn two's fixed ~70 ms sits), then grammar_threads.py (issue 33: llguidance's fill over this host's cores),
# then the demo under conformance's quick profile while time remains. Carry .whl .dev.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
mkdir -p $OUT/rs
OUT=$OUT/rs bash .dev/resume_serve.sh 2>&1 | tail -40 | cut -c1-400; echo "resume t=$(el)"
PYTHONPATH=/tmp/site timeout 90 python .dev/grammar_threads.py 2>&1 | head -14; echo "threads t=$(el)"
[ $(el) -lt 480 ] && { bash .dev/demo_conformance.sh "" quick demo 2>&1 | tail -12; echo "demo t=$(el)"; cd $OUT && tar czf r.tgz r && rm -rf r; }
nvidia-smi --query-gpu=name --format=csv

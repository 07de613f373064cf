#!/usr/bin/env bash
# Thirty-seventh session, second call: the 35B-A3B's 8 x 1,024 prefill idle with the Python frames of the
# host's long calls (prefill_gaps.py with stacks), then the demo x32 json decode steps profiled with Python
# stacks (grammar_trace.py: traces under $R/trace-demo). ~150 s. Carry .whl .whl-test .dev.
. .dev/start.sh
timeout 150 python .dev/prefill_gaps.py qwen3_5-35b-a3b 8 1024 $R 2>&1 | grep -v "arn\|^ *_warn" \
  > $R/gaps-stacks.txt; echo "gaps rc=$? t=$(el)"; head -60 $R/gaps-stacks.txt | cut -c1-250
TRACE_DIR=$R/trace-demo timeout 150 python .dev/grammar_trace.py --streams 32 --prompt 1024 --new 64 \
  --grammar json --profile > $R/demo-profile.txt 2>&1; echo "trace rc=$? t=$(el)"
grep -a -A18 "Self CPU" $R/demo-profile.txt | tail -20 | cut -c1-200
ls -la $R/trace-demo
cd $OUT && tar czf r.tgz r && rm -rf r

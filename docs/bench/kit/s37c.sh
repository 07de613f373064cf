#!/usr/bin/env bash
# Thirty-seventh session, third call: the demo x32 json decode steps profiled with Python stacks
# (grammar_trace.py, issue 33's demo half), then issue 36's restore through HTTP on the card at hand
# (resume_serve.sh: disk, page cache, disk again). ~480 s. Carry .whl .whl-test .dev.
. .dev/start.sh
TRACE_DIR=$R/trace-demo timeout 150 python .dev/grammar_trace.py --streams 32 --prompt 1024 --new 64 \
  --grammar json --profile > $R/demo-profile.txt 2>&1; echo "trace rc=$? t=$(el)"
grep -a -A60 "trace1.json: frames" $R/demo-profile.txt | cut -c1-220
rm -rf $R/trace-demo
case "$CARD" in *H200*) ;; *) mkdir -p $OUT/rs; OUT=$OUT/rs bash .dev/resume_serve.sh 2>&1 \
  | grep -a "resume c32\|read back\|rc=\|READY" | cut -c1-300; echo "resume t=$(el)";; esac
cd $OUT && tar czf r.tgz r && rm -rf r

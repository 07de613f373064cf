#!/usr/bin/env bash
# Issue 33's grammar cost with a matcher compiled for each lane (no shared lexer), besides the slices,
# the fused masked draw, the masks filled ahead and the next step made ready first: 9B and demo x32
# (json against none) and x1 by tfd bench, and 9B x32 json through grammar_timeline.py. Carry .whl .dev.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
ROOT=$PWD
bash .dev/install.sh > /dev/null 2>&1 || { echo install fails; exit 1; }
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R; cd /tmp
nproc; python -c "import os; print(os.cpu_count(), len(os.sched_getaffinity(0)))"
run() {  # name, timeout, flags...
  local name=$1 limit=$2; shift 2
  TOKENS_OUT=$R/$name-tokens.json timeout $limit python $ROOT/.dev/grammar_timeline.py "$@" --out $R/$name \
    > $R/$name.txt 2>&1; echo "$name rc=$? t=$(el)"; grep -a "tok/s" $R/$name.txt | tail -2
  grep -a TIMELINE $R/$name.txt | python -c "import json,sys; d=json.loads(sys.stdin.read()[9:]); print({k: v['median'] if isinstance(v, dict) else v for k, v in d.items()})"
}
timeout 200 tfd bench --shape qwen3_5-9b --streams 32,1 --prompt 1024 --new 256 --grammar none,json --out $R/9b \
  > $R/9b.txt 2>&1; echo "9b rc=$? t=$(el)"; grep -a "tok/s" $R/9b.txt
timeout 100 tfd bench --streams 32,1 --prompt 1024 --new 256 --grammar none,json --out $R/demo > $R/demo.txt 2>&1
echo "demo rc=$? t=$(el)"; grep -a "tok/s" $R/demo.txt
run 9b-x32-json 150 --shape qwen3_5-9b --streams 32 --prompt 1024 --new 128 --grammar json
cd $OUT && tar czf r.tgz r && rm -rf r

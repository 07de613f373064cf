#!/usr/bin/env bash
# Issue 33's grammar cost with tfd's slices (bounded JSON strings), the fused masked draw, the masks
# filled ahead and the next step made ready first: the fill along the last run's 9B streams with deep
# copied matchers against matchers compiled anew (grammar_copies.py); 9B and demo x32 (json against
# none) and 9B x1 through grammar_timeline.py; the keyed draw's tests on the device.
# Carry .whl .whl-test .devcache .dev (.dev/toks: the streams).
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
ROOT=$PWD
bash .dev/install.sh .whl-test > /dev/null 2>&1 || { echo install fails; exit 1; }
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R; cd /tmp
nproc; python -c "import os; print(os.cpu_count(), len(os.sched_getaffinity(0)))"
run() {  # name, timeout, flags...
  local name=$1 limit=$2; shift 2
  TOKENS_OUT=$R/$name-tokens.json timeout $limit python $ROOT/.dev/grammar_timeline.py "$@" --out $R/$name \
    > $R/$name.txt 2>&1; echo "$name rc=$? t=$(el)"; grep -a "tok/s" $R/$name.txt | tail -2
  grep -a TIMELINE $R/$name.txt | python -c "import json,sys; d=json.loads(sys.stdin.read()[9:]); print({k: v['median'] if isinstance(v, dict) else v for k, v in d.items()})"
}
timeout 100 python $ROOT/.dev/grammar_copies.py $ROOT/.dev/toks/9b-x32-json-tokens.json 4 16 > $R/copies.txt 2>&1
echo "copies rc=$? t=$(el)"; cat $R/copies.txt
run 9b-x32-json 170 --shape qwen3_5-9b --streams 32 --prompt 1024 --new 128 --grammar json
run 9b-x32-none 120 --shape qwen3_5-9b --streams 32 --prompt 1024 --new 128 --grammar none
run demo-x32-json 60 --streams 32 --prompt 1024 --new 128 --grammar json
run demo-x32-none 60 --streams 32 --prompt 1024 --new 128 --grammar none
run 9b-x1 150 --shape qwen3_5-9b --streams 1 --prompt 1024 --new 128 --grammar none,json
cd $ROOT && PYTHONPATH=/tmp/site TMPDIR=$ROOT/.devcache timeout 100 python -m pytest -q -n 4 -p no:cacheprovider \
  -p no:benchmark -W ignore::DeprecationWarning tests/kernels/test_keyed_argmax.py > $R/tests.txt 2>&1; echo "tests rc=$? t=$(el)"
tail -2 $R/tests.txt
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# The mask fill along the 9B x32 run's own streams: the timeline again (the masked draw fused into the
# keyed draw) with each stream's tokens saved, then grammar_replay.py at several executor thread counts;
# the keyed draw's tests on the device. Carry .whl .whl-test .devcache .dev.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
ROOT=$PWD
bash .dev/install.sh .whl-test > /dev/null 2>&1 || { echo install fails; exit 1; }
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R; cd /tmp
nproc; cat /sys/fs/cgroup/cpu.max 2>/dev/null; python -c "import os; print(os.cpu_count(), len(os.sched_getaffinity(0)))"
TOKENS_OUT=$R/9b-json-tokens.json timeout 170 python $ROOT/.dev/grammar_timeline.py --shape qwen3_5-9b --streams 32 \
  --prompt 1024 --new 128 --grammar json --out $R/9b-json > $R/9b-json.txt 2>&1; echo "9b json rc=$? t=$(el)"
grep -a "tok/s" $R/9b-json.txt | tail -1; grep -a TIMELINE $R/9b-json.txt
timeout 200 python $ROOT/.dev/grammar_replay.py $R/9b-json-tokens.json 0 16 8 4 1 > $R/replay.txt 2>&1
echo "replay rc=$? t=$(el)"; cat $R/replay.txt
cd $ROOT && PYTHONPATH=/tmp/site TMPDIR=$ROOT/.devcache timeout 120 python -m pytest -q -n 4 -p no:cacheprovider \
  -W ignore::DeprecationWarning tests/kernels/test_keyed_argmax.py > $R/tests.txt 2>&1; echo "tests rc=$? t=$(el)"
tail -2 $R/tests.txt
cd $OUT && tar czf r.tgz r && rm -rf r

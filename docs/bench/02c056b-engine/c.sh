#!/usr/bin/env bash
# Issue 31 point 2 on the H200 (the 32-stream Flash Next assert), and issue 30's one-stream engine step and conversation.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
python -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1 || { echo pip fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
E="--shape qwen3_5-9b --temperature 0"
timeout 90 tfd bench $E --streams 1 --prompt 1024 --new 256 --out $R/engine1 > $R/engine1.txt 2>&1; tail -1 $R/engine1.txt; echo "t=$(el)"
timeout 150 tfd bench --shape qwen3_8-flash-next --streams 32 --prompt 1024 --new 128 --step-tokens 8192 --out $R/fn8192 > $R/fn8192.txt 2>&1
echo "fn 8192 rc=$?"; tail -5 $R/fn8192.txt | cut -c1-400; echo "t=$(el)"
for mode in eager graphs; do
  [ $(el) -gt 380 ] && break
  CUDA_LAUNCH_BLOCKING=1 timeout 120 python .dev31/check.py $mode 4 > $R/check-$mode.txt 2>&1
  echo "check $mode rc=$?"; grep -v "^step" $R/check-$mode.txt | tail -25 | cut -c1-300; grep "^step" $R/check-$mode.txt | tail -3 | cut -c1-300; echo "t=$(el)"
done
[ $(el) -lt 440 ] && { timeout 100 tfd bench --shape qwen3_8-flash-next --streams 32 --prompt 1024 --new 128 --out $R/fn32768 > $R/fn32768.txt 2>&1; echo "fn 32768 rc=$?"; tail -3 $R/fn32768.txt | cut -c1-400; echo "t=$(el)"; }
[ $(el) -lt 480 ] && { timeout $(( 570 - $(el) )) tfd bench $E --conversation --prompt 30000 --out $R/conv > $R/conv.txt 2>&1; tail -6 $R/conv.txt; echo "t=$(el)"; }
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R

#!/usr/bin/env bash
# Issue 31 point 2 after the grouped-zrms fix: the sanitizer run again, then Flash Next at 1 and 32 streams.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
python -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1 || { echo pip fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
PROMPT=64 timeout 120 compute-sanitizer --tool memcheck --print-limit 5 python .dev31/check2.py graphs 4 12 > $R/san12.txt 2>&1
echo "san12 rc=$? t=$(el)"; grep "=====\|^==" $R/san12.txt | head -12 | cut -c1-200
timeout 150 tfd bench --shape qwen3_8-flash-next --streams 32,1 --prompt 1024 --new 128 --out $R/fn > $R/fn.txt 2>&1
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
[2 lines of the device-side assertion message left out]

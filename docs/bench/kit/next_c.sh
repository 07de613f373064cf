#!/usr/bin/env bash
# Next session, call C (issue 31): conformance's full profile against the Flash Next demo (nothing compiled
# while serving after 8fb50c7?), then Flash Next at 1, 8 and 32 streams and the MoE shapes' 8 x 1,024 prefill
# with what the sweeps chose. Carry .whl .dev.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
bash .dev/demo_conformance.sh flashnext full flashnext; echo "t=$(el)"
[ $(el) -lt 330 ] && timeout 110 tfd bench --shape qwen3_8-flash-next --streams 1,8,32 --prompt 1024 --new 256 \
  --out $R/fn > $R/fn.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/fn.txt | cut -c1-300
for shape in qwen3_5-35b-a3b qwen3_next-80b-a3b; do
  [ $(el) -lt 470 ] && timeout 90 tfd bench --shape $shape --streams 8 --prompt 1024 --new 16 --out $R/prefill 2>&1 \
    | grep -a "x8\|rror" | cut -c1-300
done
echo "t=$(el)"
# where one stream's 1,024-token prefill leaves the device idle (68 ms of prefill, 48 of kernels): the profile's
# host table, after a warmed run
[ $(el) -lt 480 ] && timeout $(( 570 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 4 \
  --profile --out $R/pfn 2>&1 | grep -a "x1\|rror" | cut -c1-250
echo "t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Fiftieth session's second call (LIMIT s, default 420; each step begins only if its least time is left): on an
# H200 issue 31's bars first (Flash Next --streams 1,8,32 --new 256, the 80B-A3B's then the 35B-A3B's 8 x 1,024
# prefill, then 32,768 against 1,024); then, any card, the MoE's prompt tiles of 64 pairs (4 warps and 8) against
# the defaults' 128 on the 80B-A3B and the 35B-A3B: 160 and 80 routed pairs an expert fill 128-pair tiles to 62%
# and 62%, 64-pair ones to 83% and 100%, each expert's weights read three times and twice instead of twice and
# once (the same bits asked). Carry .whl .whl-test .devk.
. .dev/start.sh
LIMIT=${LIMIT:-420}
case "$CARD" in *H200*) issue31_bars "qwen3_next-80b-a3b qwen3_5-35b-a3b" 60 40 long ;; esac
M="tfd_kernels.moe"
for s in qwen3_next-80b-a3b qwen3_5-35b-a3b; do
  t=$(budget 90 50); [ $t -gt 0 ] || break
  timeout $t tfd bench --shape $s --streams 8 --prompt 1024 --new 8 --rounds 3 --variant base= \
    --variant "m64=$M.PROMPT_M=64,$M.PROMPT_WARPS=4,$M.PROMPT_DOWN_WARPS=4" --variant "m64w8=$M.PROMPT_M=64" \
    --out $R/$s-m64 > $R/$s-m64.txt 2>&1
  echo "$s m64 rc=$? t=$(el)"; grep -a "prefill\|rror" $R/$s-m64.txt | cut -c1-250
done
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Forty-ninth session (any card, ~560 s): issue 31's bars at HEAD on whatever card comes (s49a.sh runs them only
# on an H200): Flash Next --streams 1,8,32 --new 256, the MoE shapes' 8 x 1,024 prefill, one stream at 32,768
# against 1,024. Carry .whl .whl-test .devk.
. .dev/start.sh
LIMIT=${LIMIT:-560}
budget() { local left=$(( LIMIT - 10 - $(el) )); [ $left -ge $2 ] || { echo 0; return; }; echo $(( left < $1 ? left : $1 )); }
t=$(budget 130 60); [ $t -gt 0 ] && { timeout $t tfd bench --shape qwen3_8-flash-next --streams 1,8,32 \
  --prompt 1024 --new 256 --out $R/fn > $R/fn.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/fn.txt | cut -c1-300; }
for s in qwen3_5-35b-a3b qwen3_next-80b-a3b; do
  t=$(budget 80 50); [ $t -gt 0 ] || break
  timeout $t tfd bench --shape $s --streams 8 --prompt 1024 --new 8 --rounds 2 --out $R/$s > $R/$s.txt 2>&1
  echo "$s rc=$? t=$(el)"; grep -a "prefill\|rror" $R/$s.txt | cut -c1-300
done
for p in 32768 1024; do
  t=$(budget 110 50); [ $t -gt 0 ] || break
  timeout $t tfd bench --shape qwen3_8-flash-next --streams 1 --prompt $p --new 64 --out $R/long \
    > $R/long-$p.txt 2>&1; echo "long $p rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/long-$p.txt | cut -c1-300
done
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# For the forty-fifth session's last device time (~260 s, an H200 only: on any other card it stops after the
# install, its numbers would not be the bars'): issue 31's acceptance benches after the segments, DENSE_PREFIX and
# the narrow whole tile: Flash Next x1 and x32 at --new 256, the MoE shapes' 8 x 1,024 prefill, then one
# stream at 32,768 against 1,024. Carry .whl .whl-test .devk.
. .dev/start.sh
case "$CARD" in *H200*) ;; *) echo "not an H200: stopped"; exit 0 ;; esac
timeout 80 tfd bench --shape qwen3_8-flash-next --streams 1,32 --prompt 1024 --new 256 --out $R/fn > $R/fn.txt 2>&1
echo "fn rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/fn.txt | cut -c1-300
for s in qwen3_5-35b-a3b qwen3_next-80b-a3b; do
  timeout $(( 190 - $(el) )) tfd bench --shape $s --streams 8 --prompt 1024 --new 8 --rounds 2 --out $R/$s \
    > $R/$s.txt 2>&1; echo "$s rc=$? t=$(el)"; grep -a "prefill\|rror" $R/$s.txt | cut -c1-300
done
for p in 32768 1024; do
  timeout $(( 255 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt $p --new 64 --out $R/long \
    > $R/long-$p.txt 2>&1; echo "long $p rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/long-$p.txt | cut -c1-300
done
cd $OUT && tar czf r.tgz r && rm -rf r

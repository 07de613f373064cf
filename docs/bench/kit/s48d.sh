#!/usr/bin/env bash
# Forty-sixth session's last device time (~170 s, an H200 only: on any other card it stops after the install):
# issue 31's H200 bars at HEAD with the recounted rooflines: Flash Next x1 and x32 at --new 256, then the MoE
# shapes' 8 x 1,024 prefill, one round each. Carry .whl .whl-test .devk.
. .dev/start.sh
case "$CARD" in *H200*) ;; *) echo "not an H200: stopped"; cd $OUT && tar czf r.tgz r && rm -rf r; exit 0 ;; esac
timeout 80 tfd bench --shape qwen3_8-flash-next --streams 1,32 --prompt 1024 --new 256 --out $R/fn > $R/fn.txt 2>&1
echo "fn rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/fn.txt | cut -c1-300
for s in qwen3_5-35b-a3b qwen3_next-80b-a3b; do
  [ $(el) -lt 150 ] || break
  timeout $(( 200 - $(el) )) tfd bench --shape $s --streams 8 --prompt 1024 --new 8 --out $R/$s > $R/$s.txt 2>&1
  echo "$s rc=$? t=$(el)"; grep -a "prefill\|rror" $R/$s.txt | cut -c1-300
done
cd $OUT && tar czf r.tgz r && rm -rf r

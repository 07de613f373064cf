#!/usr/bin/env bash
# Fortieth session: on an H200, issue 31's acceptance runs (s39a.sh without its GPU tests, which passed on the
# H100 in s40b): Flash Next at 1, 8 and 32 streams (1,024-token prompts, 256 new), then the MoE shapes' 8 x 1,024
# prefill, two rounds, with the whole-form tile of ab5274f. On an H100: s40c.sh (that tile against the old at
# the three prefill benches). ~560 s. Carry .whl .whl-test .dev.
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash .dev/s40c.sh; fi
. .dev/start.sh
timeout $(( 300 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1,8,32 --prompt 1024 --new 256 \
  --out $R/fn > $R/fn.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "qwen3_8\|rror\|roofline" $R/fn.txt | cut -c1-300
for s in qwen3_5-35b-a3b qwen3_next-80b-a3b; do
  [ $(el) -lt 450 ] || break
  timeout $(( 575 - $(el) )) tfd bench --shape $s --streams 8 --prompt 1024 --new 8 --rounds 2 --out $R/$s \
    > $R/$s.txt 2>&1; echo "$s rc=$? t=$(el)"; grep -a "prefill\|rror" $R/$s.txt | cut -c1-300
done
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Thirty-ninth session, second call (an H200): issue 34's 9B in FP8 and bf16 at 1 and 32 streams (1,024-token
# prompts, 256 new), then the FP8 one-stream step profiled (64 new tokens), then Flash Next's one-stream decode
# at a 32,768-token prompt against 1,024 (issue 31 asks 85%). ~570 s. Carry .whl .whl-test .dev.
. .dev/start.sh
timeout $(( 140 - $(el) )) tfd bench --shape qwen3_5-9b --dtype fp8 --streams 1,32 --prompt 1024 --new 256 \
  --out $R/9b-fp8 > $R/9b-fp8.txt 2>&1; echo "9b fp8 rc=$? t=$(el)"; grep -a "qwen3_5\|rror" $R/9b-fp8.txt | cut -c1-300
timeout $(( 260 - $(el) )) tfd bench --shape qwen3_5-9b --dtype bfloat16 --streams 1,32 --prompt 1024 --new 256 \
  --out $R/9b-bf16 > $R/9b-bf16.txt 2>&1; echo "9b bf16 rc=$? t=$(el)"; grep -a "qwen3_5\|rror" $R/9b-bf16.txt | cut -c1-300
timeout $(( 360 - $(el) )) tfd bench --shape qwen3_5-9b --dtype fp8 --streams 1 --prompt 1024 --new 64 --profile \
  --out $R/9b-fp8-profile > $R/9b-fp8-profile.txt 2>&1; echo "9b fp8 profile rc=$? t=$(el)"
for p in 32768 1024; do
  [ $(el) -lt 480 ] || break
  timeout $(( 580 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt $p --new 64 --out $R/long \
    > $R/long-$p.txt 2>&1; echo "long $p rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/long-$p.txt | cut -c1-300
done
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Thirty-sixth session: issue 36's page-cache point first on an H200 (start.sh), then issue 31's MoE-shape
# prefill profiled at the committed defaults: 35B-A3B and Qwen3-Next-80B-A3B 8 x 1,024 with --profile (the
# prefill's kernels by name, then a short decode), one round each. ~450 s after the start. Carry .whl .whl-test .dev.
. .dev/start.sh
for s in qwen3_5-35b-a3b qwen3_next-80b-a3b; do
  [ $(el) -lt 420 ] || break
  timeout $(( 570 - $(el) )) tfd bench --shape $s --streams 8 --prompt 1024 --new 8 --rounds 1 --profile \
    --out $R/$s 2>&1 | grep -a "prefill\|rror" | cut -c1-300
done
echo "t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

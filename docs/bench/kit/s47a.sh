#!/usr/bin/env bash
# For the forty-fifth session's first call, on an H200 (~590 s): issue 31's benches after the forty-fourth
# session's changes (QSA's decode segments on by default; the prompt pass's host work: PromptLanes by numpy in one
# copy, made after the first projection, a step's page ids in one copy): the MoE shapes' 8 x 1,024 prefill
# (34.4% / 34.0% of the matmul rate before; 35% asked), Flash Next at 1, 8 and 32 streams (--new 256; x1 63.6%
# before, 70% asked), then one stream at 32,768 and 1,024 tokens (84.7% before, 85% asked). Carry .whl .whl-test
# .devk. s47b.sh has the GPU tests of what was built without a device.
. .dev/start.sh
for s in qwen3_5-35b-a3b qwen3_next-80b-a3b; do
  timeout 130 tfd bench --shape $s --streams 8 --prompt 1024 --new 8 --rounds 2 --out $R/$s \
    > $R/$s.txt 2>&1; echo "$s rc=$? t=$(el)"; grep -a "prefill\|rror" $R/$s.txt | cut -c1-300
done
timeout $(( 430 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1,8,32 --prompt 1024 --new 256 \
  --out $R/fn > $R/fn.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/fn.txt | cut -c1-300
for p in 32768 1024; do
  timeout $(( 585 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt $p --new 64 --out $R/long \
    > $R/long-$p.txt 2>&1; echo "long $p rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/long-$p.txt | cut -c1-300
done
cd $OUT && tar czf r.tgz r && rm -rf r

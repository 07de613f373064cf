#!/usr/bin/env bash
# Forty-first session, fourth call (an H200): where the one-stream steps short of their bars go, kernel by
# kernel: Qwen3-Next-80B-A3B whole in FP8 (290 tok/s, 28% of roofline), Flash Next (64%), the 35B-A3B in FP8;
# then the 35B-A3B's 8 x 1,024 prefill step's idle time after the lanes' cheaper opening (50aae54). ~300 s.
# Carry .whl .whl-test .devk.
. .dev/start.sh
for s in qwen3_next-80b-a3b:fp8 qwen3_8-flash-next:bfloat16 qwen3_5-35b-a3b:fp8; do
  timeout $(( 130 + $(el) )) tfd bench --shape ${s%:*} --dtype ${s#*:} --streams 1 --prompt 1024 --new 64 --profile \
    --out $R/prof-${s%:*} > $R/prof-${s%:*}.txt 2>&1; echo "${s%:*} rc=$? t=$(el)"
  grep -a "decode\|rror" $R/prof-${s%:*}.txt | head -3 | cut -c1-300
done
prefill_idle
cd $OUT && tar czf r.tgz r && rm -rf r

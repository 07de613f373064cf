#!/usr/bin/env bash
# Forty-first session, second call (an H200): issue 34's acceptance runs with the swapped few-row FP8 form on
# (SWAP_ROWS 16, its pipeline 4 stages against 6: fp8_stages.py's 6 won on the larger products): the 9B in FP8
# at 1 and 32 streams, then in bf16, then the 35B-A3B in FP8 at one stream (1,024-token prompts, 256 new).
# ~500 s. Carry .whl .whl-test .devk.
. .dev/start.sh
S6=tfd_kernels.fp8_gemm.SWAP_STAGES=6
timeout 200 tfd bench --shape qwen3_5-9b --dtype fp8 --streams 1,32 --prompt 1024 --new 256 --rounds 2 \
  --variant s4= --variant s6=$S6 --out $R/9b-fp8 > $R/9b-fp8.txt 2>&1; echo "9b fp8 rc=$? t=$(el)"
grep -a "qwen3_5\|rror\|x1:\|x32:" $R/9b-fp8.txt | cut -c1-300
timeout $(( 330 - $(el) )) tfd bench --shape qwen3_5-9b --dtype bfloat16 --streams 1,32 --prompt 1024 --new 256 \
  --out $R/9b-bf16 > $R/9b-bf16.txt 2>&1; echo "9b bf16 rc=$? t=$(el)"; grep -a "qwen3_5\|rror" $R/9b-bf16.txt | cut -c1-300
timeout $(( 560 - $(el) )) tfd bench --shape qwen3_5-35b-a3b --dtype fp8 --streams 1 --prompt 1024 --new 256 --rounds 2 \
  --variant s4= --variant s6=$S6 --out $R/35b-fp8 > $R/35b-fp8.txt 2>&1; echo "35b fp8 rc=$? t=$(el)"
grep -a "qwen3_5\|rror\|x1:" $R/35b-fp8.txt | cut -c1-300
cd $OUT && tar czf r.tgz r && rm -rf r

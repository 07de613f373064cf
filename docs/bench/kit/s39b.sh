#!/usr/bin/env bash
# Thirty-ninth session, second call (an H200): issue 34 after 5ca026a (FP8 scales asked for a K block ahead).
# The FP8 GEMM's and MoE's GPU tests, the 9B in FP8 at one stream with the scales ahead against inline (the
# GEMM's; the MoE's have no switch), then the acceptance runs: the 9B in FP8 and bf16 at 1 and 32 streams,
# the 35B-A3B in FP8 at one stream (1,024-token prompts, 256 new). ~570 s. Carry .whl .whl-test .dev.
. .dev/start.sh
timeout 120 python -m pytest -q -m gpu -n 4 -p no:cacheprovider -p no:benchmark -W ignore::DeprecationWarning \
  tests/kernels/test_fp8_gemm.py tests/kernels/test_moe_fp8_gpu.py tests/pool/test_staging.py 2>&1 | tee $R/gpu-tests.txt \
  | grep -a "passed\|failed\|FAILED\|Error" | cut -c1-250 | tail -8
echo "tests t=$(el)"
timeout $(( 250 - $(el) )) tfd bench --shape qwen3_5-9b --dtype fp8 --streams 1 --prompt 1024 --new 128 --rounds 2 \
  --variant ahead= --variant inline=tfd_kernels.fp8_gemm.SCALES_AHEAD=0 --out $R/9b-fp8-ahead \
  > $R/9b-fp8-ahead.txt 2>&1; echo "ahead rc=$? t=$(el)"; grep -a "variant\|decode\|rror" $R/9b-fp8-ahead.txt | cut -c1-300
for d in fp8 bfloat16; do
  [ $(el) -lt 420 ] || break
  timeout $(( 480 - $(el) )) tfd bench --shape qwen3_5-9b --dtype $d --streams 1,32 --prompt 1024 --new 256 \
    --out $R/9b-$d > $R/9b-$d.txt 2>&1; echo "9b $d rc=$? t=$(el)"; grep -a "qwen3_5\|rror" $R/9b-$d.txt | cut -c1-300
done
[ $(el) -lt 500 ] && timeout $(( 580 - $(el) )) tfd bench --shape qwen3_5-35b-a3b --dtype fp8 --streams 1 --prompt 1024 \
  --new 256 --out $R/35b-fp8 > $R/35b-fp8.txt 2>&1; echo "35b fp8 rc=$? t=$(el)"
grep -a "qwen3_5\|rror" $R/35b-fp8.txt | cut -c1-300
cd $OUT && tar czf r.tgz r && rm -rf r

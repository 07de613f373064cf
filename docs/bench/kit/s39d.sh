#!/usr/bin/env bash
# Thirty-ninth session, one call for what was left of the budget (~450 s): the pinned ring's and the FP8
# kernels' GPU tests, the 9B in FP8 at one stream with the scales a K block ahead against inline, the 35B-A3B
# in FP8 at one stream (the MoE's one-row FP8 launch, scales ahead), then Flash Next at 1 and 32 streams
# (issue 31's decode bars) while time is left. Carry .whl .whl-test .dev.
. .dev/start.sh
timeout 100 python -m pytest -q -m gpu -n 4 -p no:cacheprovider -p no:benchmark -W ignore::DeprecationWarning \
  tests/pool/test_staging.py tests/kernels/test_fp8_gemm.py tests/kernels/test_moe_fp8_gpu.py 2>&1 \
  | tee $R/gpu-tests.txt | grep -a "passed\|failed\|FAILED\|Error" | cut -c1-250 | tail -8
echo "tests t=$(el)"
timeout $(( 210 - $(el) )) tfd bench --shape qwen3_5-9b --dtype fp8 --streams 1 --prompt 1024 --new 128 \
  --variant ahead= --variant inline=tfd_kernels.fp8_gemm.SCALES_AHEAD=0 --out $R/9b-fp8-ahead \
  > $R/9b-fp8-ahead.txt 2>&1; echo "ahead rc=$? t=$(el)"; grep -a "variant\|qwen3_5\|rror" $R/9b-fp8-ahead.txt | cut -c1-300
timeout $(( 300 - $(el) )) tfd bench --shape qwen3_5-35b-a3b --dtype fp8 --streams 1 --prompt 1024 --new 128 \
  --out $R/35b-fp8 > $R/35b-fp8.txt 2>&1; echo "35b fp8 rc=$? t=$(el)"; grep -a "qwen3_5\|rror" $R/35b-fp8.txt | cut -c1-300
[ $(el) -lt 330 ] && timeout $(( 440 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1,32 --prompt 1024 \
  --new 256 --out $R/fn > $R/fn.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/fn.txt | cut -c1-300
cd $OUT && tar czf r.tgz r && rm -rf r

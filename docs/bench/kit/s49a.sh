#!/usr/bin/env bash
# Forty-seventh session's device calls (any card), within LIMIT seconds (default 580; LIMIT=420 or 200 for what
# is left of a budget: each step starts only if its least time is left, and stops by its own cap or the limit).
# On an H200: issue 31's bars at HEAD (Flash Next --streams 1,8,32 --new 256 as the acceptance states it, the MoE
# shapes' 8 x 1,024 prefill), then one stream at 32,768 against 1,024, then the review's GPU tests. On any other
# card: the review's GPU tests (FP8 MoE with the bf16 buffer of terms, both prompt mix forms, the block from its
# input), the device path's MoE families, then the Flash Next demo's full conformance (warm-up compiles the new
# variants before READY). Carry .whl .whl-test .devk .devcache.
. .dev/start.sh
LIMIT=${LIMIT:-580}
review() {
  gpu_tests $1 4 -rE tests/kernels/test_moe_fp8_gpu.py tests/kernels/test_hyper_mix.py tests/kernels/test_moe_block.py \
    tests/kernels/test_moe_gpu.py
  grep -a "^ERROR\|^FAILED\|^E  " $R/gpu-tests.txt | cut -c1-200 | head -8; mv $R/gpu-tests.txt $R/gpu-tests-kernels.txt
}
case "$CARD" in
*H200*)
  issue31_bars "qwen3_5-35b-a3b qwen3_next-80b-a3b" 80 50 long
  t=$(budget 120 60); [ $t -gt 0 ] && review $t ;;
*)
  t=$(budget 120 40); [ $t -gt 0 ] && review $t
  t=$(budget 150 90); [ $t -gt 0 ] && { gpu_tests $t 2 -rE tests/engine/test_device_path.py \
    -k "qwen3_5_moe or qwen4_exp or qwen3_next"; grep -a "^ERROR\|^FAILED\|^E  " $R/gpu-tests.txt | cut -c1-200 | head -8; }
  [ $(budget 250 250) -gt 0 ] && { bash .dev/demo_conformance.sh flashnext full flashnext; echo "conformance t=$(el)"; } ;;
esac
cd $OUT && tar czf r.tgz r && rm -rf r

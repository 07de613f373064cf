#!/usr/bin/env bash
# Forty-sixth session's last device time (~150 s). On an H200 s48d.sh's bars (Flash Next x1/x32, the MoE shapes'
# prefill); on any other card the GPU tests of the review's changes: the FP8 MoE paths with the buffer of terms in
# bf16, the apart and one-launch prompt mix tiles, the block from its input. Carry .whl .whl-test .devk.
. .dev/start.sh
case "$CARD" in
*H200*) bash .dev/s48d.sh; exit 0 ;;
esac
gpu_tests 110 4 -rE tests/kernels/test_moe_fp8_gpu.py tests/kernels/test_hyper_mix.py tests/kernels/test_moe_block.py
grep -a "^ERROR\|^FAILED\|^E  " $R/gpu-tests.txt | cut -c1-200 | head -8
cd $OUT && tar czf r.tgz r && rm -rf r

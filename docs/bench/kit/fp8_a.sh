#!/usr/bin/env bash
# Issue 34's first GPU call: the FP8 GEMM's GPU tests (bits on the device: the agreement bound, batch
# invariance over 1..300 rows and both forms), the FP8 MoE kernels' (once they exist), then the 9B shape in
# bf16 and in FP8 at 1 and 32 streams, 1,024-token prompts, 256 new tokens, rounds interleaved (the
# acceptance's workload: FP8 >= 80% of its roofline at one stream, >= 1.6x bf16's tok/s; >= 70% at 32).
# Carry .whl .whl-test .dev .devcache.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh .whl-test || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
TESTS="tests/kernels/test_fp8_gemm.py tests/kernels/test_moe_fp8_gpu.py tests/families/test_fp8_gpu.py"
TMPDIR=$PWD/.devcache timeout 240 python -m pytest -v -m gpu -n 4 -p no:cacheprovider -p no:benchmark -W ignore::DeprecationWarning \
  -rfE --durations=10 $TESTS > $R/gpu-tests.txt 2>&1
echo "gpu tests rc=$? t=$(el)"; grep -a "FAILED\|ERROR\|passed\|failed" $R/gpu-tests.txt | cut -c1-220 | head -20
for dtype in bfloat16 fp8; do
  [ $(el) -lt 420 ] || break
  TF_SHAPE=qwen3_5-9b timeout $(( 560 - $(el) )) tfd bench --dtype $dtype --streams 1,32 --prompt 1024 \
    --new 256 --rounds 2 --out $R/9b-$dtype > $R/9b-$dtype.txt 2>&1
  echo "9b $dtype rc=$? t=$(el)"; grep -a "tok/s\|Error\|error" $R/9b-$dtype.txt | cut -c1-250 | tail -8
done
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Next session, call A (issue 31): the model-level GPU tests the twenty-second session could not finish (the
# device path and drafting, every family; 43 of 66 ran, all passed), named one by one; then the spread GEMM's
# K-segment targets and few-row tiles at Flash Next's decode products (gemm_sweep.py: the hyper down product
# [324, 10240] took 7.7 us a launch at one row, 0.86 TB/s, 32 launches a step). Carry .whl .whl-test .devcache .dev.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh .whl-test || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
TMPDIR=$PWD/.devcache timeout 330 python -m pytest -v -m gpu -n 8 -p no:cacheprovider -p no:benchmark \
  -W ignore::DeprecationWarning -rfE --durations=15 tests/engine/test_device_path.py tests/engine/test_drafting.py \
  tests/kernels/test_moe.py tests/kernels/test_moe_gpu.py tests/kernels/test_hyper.py > $R/gpu-tests.txt 2>&1
echo "gpu tests rc=$? t=$(el)"; grep -a "PASSED" $R/gpu-tests.txt | sed 's/.*PASSED //; s/\[.*//' | sort | uniq -c
grep -a "FAILED\|ERROR\|passed\|failed" $R/gpu-tests.txt | cut -c1-220 | head -20
[ $(el) -lt 400 ] && timeout $(( 560 - $(el) )) python .dev/gemm_sweep.py qwen3_8-flash-next > $R/gemm-sweep.txt 2>&1
echo "sweep rc=$? t=$(el)"; cut -c1-250 $R/gemm-sweep.txt | tail -30
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# The -m gpu tests on the H200 (issue 31: the same tokens on the GPU, Flash Next 80 wide among them).
# Carry .whl .whl-test .devcache .dev; the tiny checkpoints are prebuilt in .devcache (no transformers there).
# -p no:benchmark: the device's torch venv has pytest-benchmark, whose xdist warning is an error here.
set -u
T0=$(date +%s)
bash .dev/install.sh .whl-test || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TMPDIR=$PWD/.devcache TRITON_CACHE_DIR=/tmp/triton
timeout ${1:-300} python -m pytest -q -m gpu -n 8 -p no:cacheprovider -p no:benchmark -W ignore::DeprecationWarning \
  tests/kernels tests/engine/test_device_path.py tests/engine/test_drafting.py tests/model/test_verify.py \
  tests/model/test_ops.py tests/families/test_flash_next_variants.py tests/families/test_parity.py tests/store 2>&1 | tee $OUT/gpu-tests.txt | tail -40
echo "t=$(( $(date +%s) - T0 ))"

#!/usr/bin/env bash
# s41a.sh cut to what a call with ~250 s left can do, each result written to $OUT as it comes (a call past its
# limit still returns them): the swapped form's GPU bits tests, then fp8_stages.py's swapped arms.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh .whl-test > /dev/null 2>&1 || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
nvidia-smi --query-gpu=name --format=csv,noheader
TMPDIR=$PWD/.devcache timeout 120 python -m pytest -q -m gpu -n 4 -p no:cacheprovider -p no:benchmark \
  -W ignore::DeprecationWarning tests/kernels/test_fp8_gemm.py -k "swap or batches or near" 2>&1 \
  | tee $OUT/gpu-tests.txt | grep -a "passed\|failed\|FAILED\|Error\|assert" | cut -c1-250 | tail -12
echo "tests t=$(el)"
python .dev/fp8_stages.py swap 2>&1 | grep -v "arn" | tee $OUT/fp8-swap.txt | cut -c1-400
echo "stages t=$(el)"

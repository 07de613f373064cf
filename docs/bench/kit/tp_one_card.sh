#!/usr/bin/env bash
# Issue 35 on one card: two ranks of every family on the GPU over gloo (tests/model/test_tensor_parallel_gpu.py:
# the kernels' path on half the heads and half of every inner width, against one rank and the contract).
# Carry .whl .whl-test .dev .devcache (its tiny-plain/*-head-experts-128).
bash .dev/install.sh .whl-test > /dev/null 2>&1 || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
TMPDIR=$PWD/.devcache timeout ${LIMIT:-300} python -m pytest -q -m gpu -n 4 -p no:cacheprovider -p no:benchmark \
  -W ignore::DeprecationWarning tests/model/test_tensor_parallel_gpu.py 2>&1 | tail -15

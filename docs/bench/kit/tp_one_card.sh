#!/usr/bin/env bash
# Issue 35 on one card: two ranks of three families, bf16 and FP8, on the GPU over gloo
# (tests/model/test_tensor_parallel_gpu.py: the kernels' path on half the heads and half of every inner width,
# against one rank and the contract). Carry .whl .whl-test .dev .devcache-tp: made here from a CPU run's cache,
# tiny-plain/{qwen3_5,qwen3_next,qwen4_exp}-head-experts-128 and tiny-fp8/{...}-experts-256-head-aligned
# (19 MB; .devcache whole would pass the 64 MiB carry). To make it: run tests/model/test_tensor_parallel.py
# -k fp8 here, then copy /tmp/tfd-test-cache-0/tiny-plain/F-head-experts-128 and
# /tmp/tfd-test-cache-0/tiny-fp8/F-experts-256-head-aligned for F in those three into .devcache-tp/tfd-test-cache-0/.
bash .dev/install.sh .whl-test > /dev/null 2>&1 || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
TMPDIR=$PWD/.devcache-tp timeout ${LIMIT:-300} python -m pytest -q -m gpu -n 4 -p no:cacheprovider -p no:benchmark \
  -W ignore::DeprecationWarning tests/model/test_tensor_parallel_gpu.py 2>&1 | tail -15

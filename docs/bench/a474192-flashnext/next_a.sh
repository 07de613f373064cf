#!/usr/bin/env bash
# Next session, call A (issue 31): the GPU tests the QSA decode kernels (tfd_kernels.index_pool, c373494)
# the grouped norm and the hyper write_norm (b353a04) touch, then Flash Next at 1, 8 and 32 streams, its one-stream step profiled, and
# the MoE shapes' prefill at 8 streams (the issue's 35% of the matmul rate). Carry .whl .whl-test .devcache .dev.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh .whl-test || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
TMPDIR=$PWD/.devcache timeout 200 python -m pytest -q -m gpu -n 8 -p no:cacheprovider -p no:benchmark \
  -W ignore::DeprecationWarning tests/kernels/test_index_pool.py tests/kernels/test_norm.py tests/kernels/test_hyper.py \
  tests/kernels/test_block_choice.py tests/kernels/test_ple_rows.py tests/model/test_ple.py \
  tests/engine/test_device_path.py tests/engine/test_drafting.py tests/families/test_parity.py \
  tests/families/test_flash_next_variants.py tests/model/test_qsa.py > $R/gpu-tests.txt 2>&1
echo "gpu tests rc=$? t=$(el)"; tail -5 $R/gpu-tests.txt | cut -c1-250
timeout 150 tfd bench --shape qwen3_8-flash-next --streams 1,8,32 --prompt 1024 --new 256 --out $R/fn > $R/fn.txt 2>&1
echo "fn rc=$? t=$(el)"; grep "qwen3_8" $R/fn.txt | cut -c1-300
timeout 60 tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 64 --profile --out $R/profile 2>&1 | grep "x1\|rror"
# at 32k the page table holds 8,256 blocks, past block_choice's 8,192: does the choice fall back to torch's sorts?
timeout 90 tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 32768 --new 64 --profile --out $R/profile32k 2>&1 | grep "x1\|rror"
echo "t=$(el)"
for shape in qwen3_5-35b-a3b qwen3_next-80b-a3b; do
  [ $(el) -lt 480 ] && timeout 90 tfd bench --shape $shape --streams 8 --prompt 1024 --new 16 --out $R/prefill 2>&1 | grep "x8\|rror"
done
echo "t=$(el)"

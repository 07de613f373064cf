#!/usr/bin/env bash
# Session 22, call A (issue 31): the GPU tests of the kernels changed or never run on a GPU (the mix over all
# streams at once, the MoE's prompt tiles, the QSA decode store and pool, the radix block choice, the PLE rows),
# then Flash Next at 1, 8, 32 streams, and the MoE's prompt tiles against decode's at prefill (variants).
# Carry .whl .whl-test .devcache .dev.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh .whl-test || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
TMPDIR=$PWD/.devcache timeout 170 python -m pytest -q -m gpu -n 8 -p no:cacheprovider -p no:benchmark \
  -W ignore::DeprecationWarning -rfE --durations=12 tests/kernels/test_moe.py tests/kernels/test_hyper.py \
  tests/kernels/test_index_pool.py tests/kernels/test_norm.py tests/kernels/test_ple_rows.py \
  tests/kernels/test_block_choice.py > $R/gpu-kernels.txt 2>&1
echo "gpu kernel tests rc=$? t=$(el)"; grep -a "passed\|failed\|FAILED\|ERROR\|s call\|s setup" $R/gpu-kernels.txt | cut -c1-220 | head -30
V="--variant prompt= --variant decode=tfd_kernels.moe.PROMPT_ROWS=1000000 --variant chunk8k=tfd_kernels.moe.ROW_CHUNK=8192"
timeout 100 tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 32 --rounds 2 $V --out $R/var 2>&1 | grep -a "best of\|rror" | cut -c1-300
echo "t=$(el)"
timeout 110 tfd bench --shape qwen3_8-flash-next --streams 1,8,32 --prompt 1024 --new 256 --out $R/fn > $R/fn.txt 2>&1
echo "fn rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/fn.txt | cut -c1-300
for shape in qwen3_5-35b-a3b qwen3_next-80b-a3b; do
  [ $(el) -lt 470 ] && timeout 100 tfd bench --shape $shape --streams 8 --prompt 1024 --new 16 --rounds 1 $V --out $R/var 2>&1 \
    | grep -a "best of\|rror" | cut -c1-300
  echo "t=$(el)"
done
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Session 22, call B (issue 31): the model-level GPU tests (Flash Next parity and variants, QSA, PLE, the device
# path, drafting) and the MoE's prompt-tile bits; then the prefill profiled: 35B-A3B at 8 x 1,024, Flash Next at
# 1 x 1,024. Carry .whl .whl-test .devcache .dev.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh .whl-test || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
TMPDIR=$PWD/.devcache timeout 250 python -m pytest -q -m gpu -n 8 -p no:cacheprovider -p no:benchmark \
  -W ignore::DeprecationWarning -rfE --durations=12 tests/kernels/test_moe.py::test_gpu_a_prompts_tiles_give_a_row_the_bits_of_decodes \
  tests/kernels/test_moe.py::test_gpu_prefill_past_a_chunk_keeps_every_row tests/model/test_ple.py tests/model/test_qsa.py \
  tests/families/test_flash_next_variants.py tests/families/test_parity.py tests/engine/test_device_path.py \
  tests/engine/test_drafting.py > $R/gpu-model.txt 2>&1
echo "gpu model tests rc=$? t=$(el)"; grep -a "passed\|failed\|FAILED\|ERROR\|s call\|s setup" $R/gpu-model.txt | cut -c1-220 | head -30
[ $(el) -gt 250 ] && tail -c 1500 $R/gpu-model.txt
timeout 110 tfd bench --shape qwen3_5-35b-a3b --streams 8 --prompt 1024 --new 4 --profile --out $R/p35 2>&1 | grep -a "x8\|rror" | cut -c1-250
echo "t=$(el)"
[ $(el) -lt 480 ] && timeout 90 tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 4 --profile --out $R/pfn 2>&1 | grep -a "x1\|rror" | cut -c1-250
echo "t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Issue 31's prefill: the GDN prefill's launches under variants (gdn_sweep.py), then the MoE's prompt tiles and
# grouping at the 35B-A3B's 8 x 1,024 prefill (next_b.sh's first sweep: tfd bench --variant, tokens compared).
# Carry .whl .dev.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh > /dev/null 2>&1 || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 270 python .dev/gdn_sweep.py 2>&1 | tee $R/gdn_sweep.txt | cut -c1-300; echo "gdn t=$(el)"
M=tfd_kernels.moe
timeout $(( 570 - $(el) )) tfd bench --shape qwen3_5-35b-a3b --streams 8 --prompt 1024 --new 8 --rounds 1 \
  --variant base= --variant group8=$M.PROMPT_GROUP=8 --variant group32=$M.PROMPT_GROUP=32 \
  --variant down256=$M.PROMPT_DOWN_N=256,$M.PROMPT_DOWN_STAGES=2 --variant gate4=$M.PROMPT_GATE_STAGES=4 \
  --variant m128=$M.PROMPT_M=128,$M.PROMPT_GATE_STAGES=2 --out $R/var 2>&1 | grep -a "best of\|rror\|prefill" | cut -c1-300
echo "moe t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

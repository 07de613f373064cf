#!/usr/bin/env bash
# Next session, call B (issue 31): the MoE's prompt tiles swept at 8 x 1,024 prefill (tfd bench --variant, one
# process a shape, tokens compared): the down launch ran at 158 TFLOP/s and the gate-up at 274 in the
# 35B-A3B's prefill (the whole-form GEMM at 593); then, at one stream of Flash Next, the mix's K step and the
# experts' column tiles. Carry .whl .dev.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
M=tfd_kernels.moe
V="--variant base= --variant down256=$M.PROMPT_DOWN_N=256,$M.PROMPT_DOWN_STAGES=2 --variant gate4=$M.PROMPT_GATE_STAGES=4
   --variant down64=$M.PROMPT_DOWN_N=64,$M.PROMPT_DOWN_STAGES=4 --variant m128=$M.PROMPT_M=128,$M.PROMPT_GATE_STAGES=2
   --variant pairs16=$M.PROMPT_PAIRS=16 --variant group8=$M.PROMPT_GROUP=8 --variant group32=$M.PROMPT_GROUP=32"
for shape in qwen3_5-35b-a3b qwen3_8-flash-next; do
  [ $(el) -lt 260 ] && timeout 150 tfd bench --shape $shape --streams 8 --prompt 1024 --new 8 --rounds 1 $V --out $R/var 2>&1 \
    | grep -a "best of\|rror" | cut -c1-300
  echo "t=$(el)"
done
# at one stream's decode: the mix's K step (7.2 us a launch, 34 a step; its weights' copy floor 1.4 us); the mix
# and the down product before it asking for their first weights before they wait; the experts' column tiles (two
# launches, 21.8 + 11.5 us a layer, their weights' floor about 22 us: 220 gate-up programs of 32 columns leave
# the second wave two thirds full); and its 1,024-row prefill in 32-pair tiles (20 pairs an expert) and the hyper
# mix's prompt tile (17 launches of 85 us in that prefill on the H100, its product worth 9 us at the matmul rate)
H=tfd_kernels.hyper
timeout $(( 560 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 64 --rounds 2 \
  --variant base= --variant k128=$H.MIX_K=128 --variant k32=$H.MIX_K=32 \
  --variant early=$H.MIX_EARLY=1,tfd.model.hyper.DOWN_EARLY=1 --variant g16=$M.GATE_N=16 --variant g64=$M.GATE_N=64 \
  --variant d32=$M.DOWN_N=32 --variant m32=$M.PROMPT_PAIRS=16,$M.PROMPT_M=32 \
  --variant mixr128=$H.MIX_PROMPT_ROWS=128,$H.MIX_PROMPT_WARPS=8 --variant mixc64=$H.MIX_PROMPT_COLUMNS=64,$H.MIX_PROMPT_WARPS=8 \
  --variant mixs4=$H.MIX_PROMPT_STAGES=4 --out $R/var 2>&1 \
  | grep -a "best of\|rror" | cut -c1-300
echo "t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Issue 34: the MoE's FP8 decode tiles swept (tfd bench --dtype fp8 --variant, one process a shape, tokens
# compared). On the H100 (2026-12-05) the 35B-A3B's one-row launch took 29.7 us a layer in FP8 and 30.7 in
# bf16: half the bytes, the same time, so a K step's wait, not its bytes, sets it. The variants: deeper
# pipelines (more bytes in flight a program), wider column tiles (fewer, longer programs) and narrower ones
# (more programs). One stream (the one launch), then 32 streams (the plan's two launches). Carry .whl .dev.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
M=tfd_kernels.moe
ONE="--variant base= --variant s6=$M.FP8_GATE_STAGES=6 --variant s8=$M.FP8_GATE_STAGES=8
     --variant n64=$M.FP8_GATE_N=64,$M.FP8_DOWN_N=128 --variant n64s6=$M.FP8_GATE_N=64,$M.FP8_DOWN_N=128,$M.FP8_GATE_STAGES=6
     --variant n16s8=$M.FP8_GATE_N=16,$M.FP8_DOWN_N=32,$M.FP8_GATE_STAGES=8"
timeout 280 tfd bench --shape qwen3_5-35b-a3b --dtype fp8 --streams 1 --prompt 1024 --new 64 --rounds 2 $ONE \
  --out $R/one 2>&1 | grep -a "best of\|tok/s\|rror" | cut -c1-300
echo "one stream t=$(el)"
MANY="--variant base= --variant s6=$M.FP8_GATE_STAGES=6,$M.FP8_DOWN_STAGES=5
      --variant n64=$M.FP8_GATE_N=64,$M.FP8_DOWN_N=128 --variant n16=$M.FP8_GATE_N=16,$M.FP8_DOWN_N=32"
[ $(el) -lt 380 ] && timeout $(( 570 - $(el) )) tfd bench --shape qwen3_5-35b-a3b --dtype fp8 --streams 32 \
  --prompt 1024 --new 64 --rounds 2 $MANY --out $R/many 2>&1 | grep -a "best of\|tok/s\|rror" | cut -c1-300
echo "32 streams t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

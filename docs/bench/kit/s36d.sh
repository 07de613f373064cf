#!/usr/bin/env bash
# Issue 31: the MoE's new prompt tiles (moe_sweep.py's best) through the bench, against the old ones (old) and,
# for Flash Next's 20 pairs an expert, 64-pair tiles with the rest new (m64); the GPU tests of the MoE first.
# ~400 s. Carry .whl .whl-test .dev.
. .dev/start.sh
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider -p no:benchmark -W ignore::DeprecationWarning tests/kernels/test_moe_gpu.py 2>&1 | tail -3
echo "tests t=$(el)"
OLD="tfd_kernels.moe.PROMPT_M=64,tfd_kernels.moe.PROMPT_GATE_N=64,tfd_kernels.moe.PROMPT_GATE_K=128,tfd_kernels.moe.PROMPT_GATE_STAGES=3,tfd_kernels.moe.PROMPT_DOWN_N=128,tfd_kernels.moe.PROMPT_DOWN_K=128,tfd_kernels.moe.PROMPT_DOWN_STAGES=3"
M64="tfd_kernels.moe.PROMPT_M=64"
for s in qwen3_5-35b-a3b:8:1024 qwen3_next-80b-a3b:8:1024 qwen3_8-flash-next:1:1024 qwen3_5-35b-a3b:1:600; do
  IFS=: read shape streams prompt <<< "$s"
  [ $(el) -lt 500 ] || break
  timeout $(( 570 - $(el) )) tfd bench --shape $shape --streams $streams --prompt $prompt --new 8 --rounds 2 \
    --variant new= --variant old=$OLD --variant m64=$M64 --out $R/$shape-$streams 2>&1 | grep -a "prefill\|rror" | cut -c1-250
done
echo "t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

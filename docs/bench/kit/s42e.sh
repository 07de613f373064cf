#!/usr/bin/env bash
# s42d.sh cut to what ~300 s of device time allows: Flash Next's one-stream step with the MoE block in one
# launch against two, the decode mix in 8-column tiles, products' K segments of 2 steps at least; then the
# 35B-A3B's prefill host profile while time is left. Carry .whl .whl-test .devk.
. .dev/start.sh
timeout 200 tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 64 --rounds 2 --variant one= \
  --variant two=tfd_kernels.moe.ONE_LAUNCH=0 --variant c8=tfd_kernels.hyper.MIX_COLUMNS=8 \
  --variant seg2=tfd_kernels.gemm_plan.SEGMENT_STEPS=2 --out $R/fn-one > $R/fn-one.txt 2>&1
echo "fn rc=$? t=$(el)"; grep -a "x1:\|rror" $R/fn-one.txt | cut -c1-300
timeout 100 python .dev/prefill_host.py qwen3_5-35b-a3b 8 1024 2>&1 | grep -v "arn" > $R/host.txt
head -50 $R/host.txt | cut -c1-200; echo "host t=$(el)"

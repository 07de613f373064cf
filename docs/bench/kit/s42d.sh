#!/usr/bin/env bash
# Forty-first session, fifth call (an H200, ~700 s of device time left): Flash Next's one-stream step with its
# MoE block in one launch (moe_one without the norm, hidden 2,560) against two, with the mix's first up tile
# asked for early, with the mix's K steps 128 wide, its tiles 8 columns a stream, and products' K segments of
# 2 steps at least (Flash Next's hyper down rows: 40 segments, not 20); then where the 35B-A3B's 8 x 1,024 prefill step
# leaves the device idle (4.39 ms in two gaps before a host copy, s42c): the host's side by cProfile; then
# Flash Next's one-stream decode at a 32,768-token prompt profiled (what grows past 1,024: 3.07 against 2.60 ms).
# ~380 s. Carry .whl .whl-test .devk.
. .dev/start.sh
timeout 240 tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 64 --rounds 2 --variant one= \
  --variant two=tfd_kernels.moe.ONE_LAUNCH=0 --variant early=tfd_kernels.hyper.MIX_EARLY=1 \
  --variant k128=tfd_kernels.hyper.MIX_K=128 --variant c8=tfd_kernels.hyper.MIX_COLUMNS=8 \
  --variant seg2=tfd_kernels.gemm_plan.SEGMENT_STEPS=2 --out $R/fn-one \
  > $R/fn-one.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "x1:\|rror" $R/fn-one.txt | cut -c1-300
timeout $(( 330 - $(el) )) python .dev/prefill_host.py qwen3_5-35b-a3b 8 1024 2>&1 | grep -v "arn" > $R/host.txt
head -50 $R/host.txt | cut -c1-200; echo "host t=$(el)"
timeout $(( 480 - $(el) )) python .dev/long_decode.py qwen3_8-flash-next 1024,32768 2>&1 | grep -v "arn" \
  > $R/long-decode.txt; head -36 $R/long-decode.txt | cut -c1-140; echo "long t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Next session's first call (an H200; on an H100 the same, its numbers not the bars'): what the forty-first
# session's last calls could not run (no machine came). Flash Next's one-stream step: the MoE block in one
# launch (cf88943) against two, the decode mix in 8-column tiles, products' K segments of 2 steps at least,
# the mix's first up tile early; the 35B-A3B's 8 x 1,024 prefill host profile (its 4.39 ms in two gaps before a
# host copy, s42c); a Flash Next decode step's kernels at a 32,768-token context against 1,024 (long_decode.py:
# the 85% bar, 84.7% measured). First the GPU tests of the one launch at Flash Next's shape and the mixes.
# Then Flash Next's prefill mixes' tiles. ~580 s. Carry .whl .whl-test .devk.
. .dev/start.sh
mkdir -p .devcache
gpu_tests 100 4 tests/kernels/test_moe_block.py tests/kernels/test_hyper.py tests/kernels/test_gemm.py \
  -k "flash_nexts or one_launch or mix or before_the_wait or narrow_products"
# early: the hyper read's weights asked for before its waits (the mix's first tile or all five, the down product's
# first steps or its whole segment; EARLY_STEPS moves the GDN, qkv and out products' early steps too)
H=tfd_kernels.hyper.MIX_EARLY D=tfd.model.hyper.DOWN_EARLY=1 E=tfd_kernels.gemm.EARLY_STEPS
timeout $(( 300 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 64 --rounds 2 --variant one= \
  --variant two=tfd_kernels.moe.ONE_LAUNCH=0 --variant c8=tfd_kernels.hyper.MIX_COLUMNS=8 \
  --variant seg2=tfd_kernels.gemm_plan.SEGMENT_STEPS=2 --variant m1=$H=1 --variant m5=$H=5 --variant d1=$D \
  --variant d1m5=$D,$H=5 --variant d4m5=$D,$H=5,$E=4 --variant e0=$E=0 --variant e2=$E=2 \
  --out $R/fn-one > $R/fn-one.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "x1:\|rror" $R/fn-one.txt | cut -c1-300
# Flash Next's 1 x 1,024 prefill: its 33 prompt mixes took ~85 us each (2.8 ms of 43.6; 6.7 GFLOP each, ~9 us at
# the matmul rate): their tile's rows, columns a stream, warps and K step; and the hyper down rows' product back
# in the whole form's 24 programs (83 us each; the spread form since this session's gemm_plan change)
timeout $(( 390 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 8 --rounds 2 \
  --variant base= --variant whole=tfd_kernels.gemm_plan.SPREAD_PARTIALS_BYTES=0 --variant r128=tfd_kernels.hyper.MIX_PROMPT_ROWS=128 --variant c64=tfd_kernels.hyper.MIX_PROMPT_COLUMNS=64 \
  --variant w8=tfd_kernels.hyper.MIX_PROMPT_WARPS=8 --variant k128=tfd_kernels.hyper.MIX_K=128 \
  --variant r128w8=tfd_kernels.hyper.MIX_PROMPT_ROWS=128,tfd_kernels.hyper.MIX_PROMPT_WARPS=8 \
  --variant c64w8=tfd_kernels.hyper.MIX_PROMPT_COLUMNS=64,tfd_kernels.hyper.MIX_PROMPT_WARPS=8 --out $R/fn-mix \
  > $R/fn-mix.txt 2>&1; echo "fn mix rc=$? t=$(el)"; grep -a "x1:\|rror" $R/fn-mix.txt | cut -c1-300
timeout $(( 450 - $(el) )) python .dev/prefill_host.py qwen3_5-35b-a3b 8 1024 2>&1 | grep -v "arn" > $R/host.txt
head -50 $R/host.txt | cut -c1-200; echo "host t=$(el)"
timeout $(( 585 - $(el) )) python .dev/long_decode.py qwen3_8-flash-next 1024,32768 2>&1 | grep -v "arn" \
  > $R/long-decode.txt; head -36 $R/long-decode.txt | cut -c1-140; echo "long t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

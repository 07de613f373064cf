#!/usr/bin/env bash
# s43a.sh without its host profile and long-context decode, for a call with ~450 s of device time left:
# the GPU tests of this session's kernel changes, Flash Next's one-stream variants, its prompt mixes and the
# hyper down rows' form at 1 x 1,024. Carry .whl .whl-test .devk.
. .dev/start.sh
mkdir -p .devcache
gpu_tests 100 4 tests/kernels/test_moe_block.py tests/kernels/test_hyper.py tests/kernels/test_gemm.py \
  -k "flash_nexts or one_launch or mix or before_the_wait or narrow_products"
# early: the hyper read's weights asked for before its waits (the mix's first tile or all five, the down product's
# first steps or its whole segment; EARLY_STEPS moves the GDN, qkv and out products' early steps too)
H=tfd_kernels.hyper.MIX_EARLY D=tfd.model.hyper.DOWN_EARLY=1 E=tfd_kernels.gemm.EARLY_STEPS
timeout $(( 290 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 64 --rounds 2 --variant one= \
  --variant two=tfd_kernels.moe.ONE_LAUNCH=0 --variant c8=tfd_kernels.hyper.MIX_COLUMNS=8 \
  --variant seg2=tfd_kernels.gemm_plan.SEGMENT_STEPS=2 --variant m1=$H=1 --variant m5=$H=5 --variant d1=$D \
  --variant d1m5=$D,$H=5 --variant d4m5=$D,$H=5,$E=4 --variant e0=$E=0 --variant e2=$E=2 \
  --out $R/fn-one > $R/fn-one.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "x1:\|rror" $R/fn-one.txt | cut -c1-300
# Flash Next's 1 x 1,024 prefill: its 33 prompt mixes took ~85 us each (2.8 ms of 43.6; 6.7 GFLOP each, ~9 us at
# the matmul rate): their tile's rows, columns a stream, warps and K step; and the hyper down rows' product back
# in the whole form's 24 programs (83 us each; the spread form since this session's gemm_plan change)
timeout $(( 400 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 8 --rounds 2 \
  --variant base= --variant whole=tfd_kernels.gemm_plan.SPREAD_PARTIALS_BYTES=0 --variant r128=tfd_kernels.hyper.MIX_PROMPT_ROWS=128 --variant c64=tfd_kernels.hyper.MIX_PROMPT_COLUMNS=64 \
  --variant w8=tfd_kernels.hyper.MIX_PROMPT_WARPS=8 --variant k128=tfd_kernels.hyper.MIX_K=128 \
  --variant r128w8=tfd_kernels.hyper.MIX_PROMPT_ROWS=128,tfd_kernels.hyper.MIX_PROMPT_WARPS=8 \
  --variant c64w8=tfd_kernels.hyper.MIX_PROMPT_COLUMNS=64,tfd_kernels.hyper.MIX_PROMPT_WARPS=8 --out $R/fn-mix \
  > $R/fn-mix.txt 2>&1; echo "fn mix rc=$? t=$(el)"; grep -a "x1:\|rror" $R/fn-mix.txt | cut -c1-300
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Forty-third session (either card; the bars' numbers on an H200 only): QSA decode rows in segments
# (sparse_attention.DECODE_SEGMENTS, 0353572) and long rows' choice split (block_choice.SPLIT_ROWS): their kernel
# GPU tests and Flash Next's model-level ones (device path, drafting, verify), then Flash Next one stream at
# 1,024 and 32,768 tokens of context with and without each, and the hyper down rows in 40 K segments (gemm_plan
# NARROW_TILES: their bits change, so may the tokens). ~400 s. Superseded by s45d.sh
# (its model-level tests with the segments on).
# Carry .whl .whl-test .devk .devcache.
. .dev/start.sh
gpu_tests 150 8 tests/kernels/test_sparse_attention.py tests/kernels/test_block_choice.py \
  tests/engine/test_device_path.py tests/engine/test_drafting.py tests/model/test_verify.py -k "not qwen3 and not 9b"
A=tfd_kernels.sparse_attention S=tfd_kernels.block_choice
timeout $(( 260 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 64 --rounds 3 \
  --variant whole= --variant seg=$A.DECODE_SEGMENTS=1 --variant s32=$A.DECODE_SEGMENTS=1,$A.SEGMENT=32 --variant s128=$A.DECODE_SEGMENTS=1,$A.SEGMENT=128 \
  --variant n6=tfd_kernels.gemm_plan.NARROW_TILES=6 \
  --out $R/fn-1k > $R/fn-1k.txt 2>&1; echo "1k rc=$? t=$(el)"; grep -a "x1:\|rror\|cut" $R/fn-1k.txt | cut -c1-300
timeout $(( 380 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 32768 --new 64 --rounds 2 \
  --variant whole= --variant seg=$A.DECODE_SEGMENTS=1 --variant split=$A.DECODE_SEGMENTS=1,$S.SPLIT_ROWS=64 \
  --out $R/fn-32k > $R/fn-32k.txt 2>&1; echo "32k rc=$? t=$(el)"; grep -a "x1:\|rror" $R/fn-32k.txt | cut -c1-300
cd $OUT && tar czf r.tgz r && rm -rf r

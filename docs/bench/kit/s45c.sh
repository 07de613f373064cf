#!/usr/bin/env bash
# Forty-third session (either card; the bars' numbers on an H200 only): QSA decode rows in segments
# (sparse_attention.DECODE_SEGMENTS, 0353572) and long rows' choice split (block_choice.SPLIT_ROWS): their kernel
# GPU tests and Flash Next's model-level ones (device path, drafting, verify), then Flash Next one stream at
# 1,024 and 32,768 tokens of context with and without each, and the hyper down rows in 40 K segments (gemm_plan
# NARROW_TILES: their bits change, so may the tokens); on an H200 where the
# segments won at 1k, issue 31's run at 1, 8 and 32 streams with them. ~590 s.
# Carry .whl .whl-test .devk .devcache.
. .dev/start.sh
gpu_tests 150 8 tests/kernels/test_sparse_attention.py tests/kernels/test_block_choice.py \
  tests/engine/test_device_path.py tests/engine/test_drafting.py tests/model/test_verify.py -k "not qwen3 and not 9b"
A=tfd_kernels.sparse_attention S=tfd_kernels.block_choice
timeout $(( 260 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 64 --rounds 3 \
  --variant seg= --variant whole=$A.DECODE_SEGMENTS=0 --variant s32=$A.SEGMENT=32 --variant s128=$A.SEGMENT=128 \
  --variant n6=tfd_kernels.gemm_plan.NARROW_TILES=6 \
  --out $R/fn-1k > $R/fn-1k.txt 2>&1; echo "1k rc=$? t=$(el)"; grep -a "x1:\|rror\|cut" $R/fn-1k.txt | cut -c1-300
timeout $(( 380 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 32768 --new 64 --rounds 2 \
  --variant seg= --variant whole=$A.DECODE_SEGMENTS=0 --variant split=$S.SPLIT_ROWS=64 \
  --out $R/fn-32k > $R/fn-32k.txt 2>&1; echo "32k rc=$? t=$(el)"; grep -a "x1:\|rror" $R/fn-32k.txt | cut -c1-300
step() { grep -a "^$1 x1:" $R/fn-1k.txt | sed 's/.*step \([0-9.]*\) ms.*/\1/'; }
if echo "$CARD" | grep -q H200 && [ -n "$(step seg)" ] && awk "BEGIN{exit !($(step seg) < $(step whole))}"; then
  timeout $(( 590 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1,8,32 --prompt 1024 --new 256 \
    --out $R/fn-bar > $R/fn-bar.txt 2>&1; echo "bar rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/fn-bar.txt | cut -c1-300
fi
cd $OUT && tar czf r.tgz r && rm -rf r

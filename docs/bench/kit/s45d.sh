#!/usr/bin/env bash
# s45c.sh cut to fit ~400 s of device time (either card): the segments' and the split choice's kernel GPU
# tests and Flash Next's device path, drafting and verify windows (the segments on: segments_on.py), then one
# stream at 1,024 tokens (whole, segments, the hyper down rows in 40 K segments) and 32,768 (whole, segments,
# and the split choice), two rounds each.
# Carry .whl .whl-test .devk .devcache.
# The segments change a decode row's bits (not its batch's): the bench may print "NOT the same" tokens for
# them against whole; the contract is the GPU tests'.
. .dev/start.sh
export PYTHONPATH=$PYTHONPATH:$PWD/.dev  # segments_on.py: the model-level tests with the segments on
gpu_tests 110 8 -p segments_on tests/kernels/test_sparse_attention.py tests/kernels/test_block_choice.py \
  tests/engine/test_device_path.py tests/engine/test_drafting.py tests/model/test_verify.py -k "not qwen3 and not 9b"
A=tfd_kernels.sparse_attention S=tfd_kernels.block_choice
timeout $(( 220 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 64 --rounds 2 \
  --variant whole= --variant seg=$A.DECODE_SEGMENTS=1 --variant n6=tfd_kernels.gemm_plan.NARROW_TILES=6 \
  --out $R/fn-1k > $R/fn-1k.txt 2>&1; echo "1k rc=$? t=$(el)"; grep -a "x1:\|rror\|cut" $R/fn-1k.txt | cut -c1-300
timeout $(( 390 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 32768 --new 64 --rounds 2 \
  --variant whole= --variant seg=$A.DECODE_SEGMENTS=1 --variant split=$A.DECODE_SEGMENTS=1,$S.SPLIT_ROWS=64 \
  --out $R/fn-32k > $R/fn-32k.txt 2>&1; echo "32k rc=$? t=$(el)"; grep -a "x1:\|rror" $R/fn-32k.txt | cut -c1-300
cd $OUT && tar czf r.tgz r && rm -rf r

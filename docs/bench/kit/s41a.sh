#!/usr/bin/env bash
# Next call for issue 34 (either card): the FP8 GEMM's GPU tests (the swapped few-row form's bits against the
# unswapped on random inputs at the 9B's shapes, and a row alone against batches with SWAP_ROWS 16), then
# fp8_stages.py's swapped arms (4, 6, 8 stages at 1 and 16 rows), then the 9B in FP8 at one stream with
# SWAP_ROWS=16 against the defaults (two rounds interleaved: the tokens must be the same if the bits are).
# ~450 s. Carry .whl .whl-test .dev .devcache (as s40a).
. .dev/start.sh
gpu_tests 150 4 tests/kernels/test_fp8_gemm.py
timeout 150 python .dev/fp8_stages.py swap 2>&1 | grep -v "arn" | tee $R/fp8-swap.txt | cut -c1-400
echo "stages t=$(el)"
timeout $(( 560 - $(el) )) tfd bench --shape qwen3_5-9b --dtype fp8 --streams 1,32 --prompt 1024 --new 128 --rounds 2 \
  --variant base= --variant swap=tfd_kernels.fp8_gemm.SWAP_ROWS=16 --out $R/9b-fp8-swap > $R/9b-fp8-swap.txt 2>&1
echo "swap rc=$? t=$(el)"; grep -a "x1:\|x32:\|rror" $R/9b-fp8-swap.txt | cut -c1-300
cd $OUT && tar czf r.tgz r && rm -rf r

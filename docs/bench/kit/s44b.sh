#!/usr/bin/env bash
# After s44a.sh (an H200 for the bar's numbers): issue 31's long-context bar (decode at 32,768 tokens of context
# >= 85% of its 1,024-token figure; 84.7% measured) against QSA's choice for a row of more blocks than a program
# sorts (8,256 at 32k: _choose_long, one program a row, 25 chunks in turn a layer): its chunk and warps, which
# change no choice (the GPU test first). ~300 s. Carry .whl .whl-test .devk.
. .dev/start.sh
mkdir -p .devcache
gpu_tests 80 4 tests/kernels/test_block_choice.py
C=tfd_kernels.block_choice.LONG_CHUNK W=tfd_kernels.block_choice.LONG_WARPS
timeout $(( 290 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 32768 --new 64 --rounds 2 \
  --variant base= --variant w16=$W=16 --variant c4k=$C=4096 --variant c4kw16=$C=4096,$W=16 --out $R/long-choice \
  > $R/long-choice.txt 2>&1; echo "long rc=$? t=$(el)"; grep -a "x1:\|rror\|cut" $R/long-choice.txt | cut -c1-300
cd $OUT && tar czf r.tgz r && rm -rf r

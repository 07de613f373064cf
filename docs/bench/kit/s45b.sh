#!/usr/bin/env bash
# Forty-third session, after s45a.sh (an H200 for the bar's numbers): issue 31's long-context bar (decode at
# 32,768 tokens of context >= 85% of its 1,024-token figure; 84.7% measured) with QSA's long rows split over
# programs (block_choice._choose_split, a slice a program, the row's last sorting their best) against the radix
# passes of one program a row (the default until timed): the GPU tests, then both at 32,768 and at 1,024. ~420 s.
# Carry .whl .whl-test .devk.
. .dev/start.sh
mkdir -p .devcache
gpu_tests 100 4 tests/kernels/test_block_choice.py
S=tfd_kernels.block_choice
for prompt in 32768 1024; do
  timeout $(( 420 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt $prompt --new 64 --rounds 2 \
    --variant passes= --variant split=$S.SPLIT_ROWS=64 --variant from4k=$S.SPLIT_ROWS=64,$S.SPLIT_FROM=4097 \
    --out $R/long-$prompt \
    > $R/long-$prompt.txt 2>&1; echo "$prompt rc=$? t=$(el)"; grep -a "x1:\|rror\|cut" $R/long-$prompt.txt | cut -c1-300
done
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Forty-third session, first call (either card; the bar's numbers on an H200 only): the hyper read in one
# launch (tfd_kernels.hyper_read: write and norm, down product, mix): its GPU tests with the mix's at 6373f07's
# defaults, then Flash Next at one stream with the read in 3, 2 and 1 launches (the bench compares the
# tokens), then on an H200 the one-stream run at 256 new tokens either way, then long_decode.py (a step's kernels at
# 32,768 against 1,024 tokens of context) while time remains. ~580 s.
# Carry .whl .whl-test .devk.
. .dev/start.sh
mkdir -p .devcache
gpu_tests 150 4 tests/kernels/test_hyper_read.py tests/kernels/test_hyper.py
L=tfd_kernels.hyper_read.LAUNCHES
timeout $(( 340 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 64 --rounds 3 \
  --variant l3= --variant l2=$L=2 --variant l1=$L=1 --variant l1d4=$L=1,tfd_kernels.hyper_read.DOWN_EARLY=4 \
  --out $R/fn-read > $R/fn-read.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "x1:\|rror\|cut" $R/fn-read.txt | cut -c1-300
if echo "$CARD" | grep -q H200; then  # issue 31's one-stream run (--new 256), the step against its 1.67 ms roofline
  timeout $(( 480 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 256 --rounds 2 \
    --variant l3= --variant l1=$L=1 --out $R/fn-bar > $R/fn-bar.txt 2>&1; echo "bar rc=$? t=$(el)"
  grep -a "x1:\|rror" $R/fn-bar.txt | cut -c1-300
fi
timeout $(( 580 - $(el) )) python .dev/long_decode.py qwen3_8-flash-next 1024,32768 2>&1 | grep -v "arn" \
  > $R/long-decode.txt; head -36 $R/long-decode.txt | cut -c1-140; echo "long t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Forty-third session's first call (either card; the bars' numbers on an H200 only): the GPU tests of 6373f07's
# mix defaults (five K tiles early at decode, 8 columns a stream), Flash Next one stream with them against the old
# ones, then what s43a.sh's last two parts ask (the 35B-A3B's 8 x 1,024 prefill host profile, a decode step's
# kernels at 32,768 against 1,024 tokens of context). ~480 s. Carry .whl .whl-test .devk.
. .dev/start.sh
mkdir -p .devcache
gpu_tests 90 4 tests/kernels/test_hyper.py
timeout $(( 230 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 64 --rounds 3 \
  --variant new= --variant old=tfd_kernels.hyper.MIX_EARLY=0,tfd_kernels.hyper.MIX_COLUMNS=16 --out $R/fn-new \
  > $R/fn-new.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "x1:\|rror\|cut" $R/fn-new.txt | cut -c1-300
timeout $(( 300 - $(el) )) python .dev/prefill_host.py qwen3_5-35b-a3b 8 1024 2>&1 | grep -v "arn" > $R/host.txt
head -50 $R/host.txt | cut -c1-200; echo "host t=$(el)"
timeout $(( 470 - $(el) )) python .dev/long_decode.py qwen3_8-flash-next 1024,32768 2>&1 | grep -v "arn" \
  > $R/long-decode.txt; head -36 $R/long-decode.txt | cut -c1-140; echo "long t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

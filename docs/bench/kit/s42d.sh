#!/usr/bin/env bash
# Forty-first session, fifth call (an H200): Flash Next's one-stream step with its MoE block in one launch
# (moe_one without the norm, hidden 2,560) against two, and with the mix's first up tile asked for early;
# issue 31's conformance point (the full profile against the Flash Next demo daemon, contexts past its
# budget); then where the 35B-A3B's 8 x 1,024 prefill step leaves the device idle (4.39 ms in two gaps
# before a host copy, s42c): the host's side by cProfile, then the long host calls with their stacks.
# ~560 s. Carry .whl .whl-test .devk.
. .dev/start.sh
timeout 150 tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 64 --rounds 2 --variant one= \
  --variant two=tfd_kernels.moe.ONE_LAUNCH=0 --variant early=tfd_kernels.hyper.MIX_EARLY=1 --out $R/fn-one \
  > $R/fn-one.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "x1:\|rror" $R/fn-one.txt | cut -c1-300
bash .dev/demo_conformance.sh flashnext full flashnext; echo "conformance t=$(el)"
timeout 100 python .dev/prefill_host.py qwen3_5-35b-a3b 8 1024 2>&1 | grep -v "arn" > $R/host.txt
head -50 $R/host.txt | cut -c1-200; echo "host t=$(el)"
[ $(el) -lt 470 ] && GAPS_STACKS=1 timeout $(( 585 - $(el) )) python .dev/prefill_gaps.py qwen3_5-35b-a3b 8 1024 $R \
  2>&1 | grep -v "arn\|^ *_warn" > $R/gaps-stacks.txt; tail -40 $R/gaps-stacks.txt | cut -c1-200; echo "gaps t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Forty-fourth session: Flash Next's 1 x 1,024 prefill (17.5% of the matmul rate on the H200, bar 25%) with many
# rows of narrow products spread (gemm_plan.SPREAD_PARTIALS: the hyper down rows' 24 whole-form programs, 83 us
# each) and the prompt mix's tiles (83 us a mix, its product 9 us of FLOPs), the tokens compared (the same bits:
# scheduling and tiles); then the 35B-A3B's 8 x 1,024 prefill step's idle gaps, each with what the host did in it
# (prefill_gaps.py without stacks). ~330 s. Carry .whl .whl-test .devk .devcache.
. .dev/start.sh
gpu_tests 70 4 tests/kernels/test_gemm.py -k "many_rows"
G=tfd_kernels.gemm_plan H=tfd_kernels.hyper
timeout $(( 230 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 8 --rounds 2 \
  --variant base= --variant wide=$G.SPREAD_PARTIALS=67108864 --variant r128=$H.MIX_PROMPT_ROWS=128 \
  --variant c16=$H.MIX_PROMPT_COLUMNS=16 --variant c64=$H.MIX_PROMPT_COLUMNS=64 --variant w8=$H.MIX_PROMPT_WARPS=8 \
  --variant s2=$H.MIX_PROMPT_STAGES=2 --out $R/fn-prefill > $R/fn-prefill.txt 2>&1
echo "fn prefill rc=$? t=$(el)"; grep -a "prefill\|rror\|x1:\|NOT" $R/fn-prefill.txt | cut -c1-300
GAPS_STACKS=0 timeout $(( 330 - $(el) )) python .dev/prefill_gaps.py qwen3_5-35b-a3b 8 1024 $R 2>&1 \
  | grep -v "arn\|^ *_warn" > $R/gaps.txt; echo "gaps t=$(el)"; head -80 $R/gaps.txt | cut -c1-130
cd $OUT && tar czf r.tgz r && rm -rf r

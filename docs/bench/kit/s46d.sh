#!/usr/bin/env bash
# s46b.sh cut to ~390 s (the budget left after five refused starts): the drafting GPU tests with QSA's segments on,
# their errors named; Flash Next's 1 x 1,024 prefill under the wide spread and the prompt mix's tiles; the 35B-A3B's
# prefill gaps with what the host did in each, if time is left. Carry .whl .whl-test .devk .devcache.
. .dev/start.sh
export PYTHONPATH=$PYTHONPATH:$PWD/.dev  # segments_on.py
gpu_tests 100 8 -rE -p segments_on tests/engine/test_drafting.py tests/kernels/test_gemm.py -k "(not qwen3 and not 9b) or many_rows"
grep -a "^ERROR\|^E  " $R/gpu-tests.txt | cut -c1-200 | head -8
G=tfd_kernels.gemm_plan H=tfd_kernels.hyper
timeout $(( 290 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 8 --rounds 2 \
  --variant base= --variant wide=$G.SPREAD_PARTIALS=67108864 --variant r128=$H.MIX_PROMPT_ROWS=128 \
  --variant c64=$H.MIX_PROMPT_COLUMNS=64 --variant w8=$H.MIX_PROMPT_WARPS=8 \
  --out $R/fn-prefill > $R/fn-prefill.txt 2>&1
echo "fn prefill rc=$? t=$(el)"; grep -a "prefill\|rror\|x1:\|NOT" $R/fn-prefill.txt | cut -c1-300
if [ $(el) -lt 300 ]; then
  GAPS_STACKS=0 timeout $(( 390 - $(el) )) python .dev/prefill_gaps.py qwen3_5-35b-a3b 8 1024 $R 2>&1 \
    | grep -v "arn\|^ *_warn" > $R/gaps.txt; echo "gaps t=$(el)"; head -70 $R/gaps.txt | cut -c1-130
fi
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Issue 34: the FP8 decode step's time, product by product (fp8_diag.py on the 9B shape), after the MoE
# block's one-row launch in bf16 (qwen3_next-80b-a3b cut to fit, profiled: its _one_row time a layer beside
# FP8's 43 us). Carry .whl .whl-test .dev.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh .whl-test > /dev/null 2>&1 || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
TF_SHAPE=qwen3_next-80b-a3b timeout 150 tfd bench --streams 1 --prompt 1024 --new 64 --profile --out $R/80b-bf16 \
  > $R/80b-bf16.txt 2>&1
echo "80b bf16 rc=$? t=$(el)"; grep -a "tok/s" $R/80b-bf16.txt | cut -c1-250
grep -a "_one_row\|_spread\|_quantize" $R/80b-bf16/*-decode.txt | head -5 | cut -c1-200
cd $OUT && tar czf r.tgz r && cd - > /dev/null
timeout $(( ${LIMIT:-540} - $(el) )) python .dev/fp8_diag.py qwen3_5-9b > $R/diag-9b.txt 2>&1
echo "diag rc=$? t=$(el)"; cut -c1-400 $R/diag-9b.txt | tail -16
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Issue 31: the MoE's prompt tiles at few pairs an expert (moe_sweep.py THIN, Flash Next's and the 35B-A3B's
# one 1,024-row prompt), the GEMM's whole form at 8,192 rows (gemm_prefill_sweep.py), then the 35B-A3B's
# 8 x 1,024 prefill profiled at the new MoE tiles. ~250 s. Carry .whl .whl-test .dev.
. .dev/start.sh
export MOE_SHAPES=flash,35b-1
V="defaults t_m64 t_m64k128 t_m64k128s5 t_m32 t_m32w8 t_m32n128 t_m64s6 t_group8 t_group0"
for i in 0 1 2 3; do timeout 200 python .dev/moe_sweep.py compile 4 $i $V > $R/compile$i.txt 2>&1 & done; wait
echo "compiled t=$(el)"; grep -h "fails\|rror" $R/compile*.txt | head -5
timeout 200 python .dev/moe_sweep.py time $V 2>&1 | grep -v arn | tee $R/moe_thin.txt | cut -c1-200
echo "thin t=$(el)"
timeout 200 python .dev/gemm_prefill_sweep.py 2>&1 | tee $R/gemm_prefill.txt | cut -c1-900
echo "gemm t=$(el)"
timeout $(( 570 - $(el) )) tfd bench --shape qwen3_5-35b-a3b --streams 8 --prompt 1024 --new 8 --rounds 1 --profile \
  --out $R/profile 2>&1 | grep -a "prefill\|rror" | cut -c1-300
echo "t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

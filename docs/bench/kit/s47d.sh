#!/usr/bin/env bash
# For the forty-fifth session, any card (~280 s): s47c.sh's prefill variants lost or drowned in the rounds'
# spread (base 28.0 / 32.2 ms), so the two launches alone: hyper_prompt_sweep.py (the down rows' whole tiles,
# the prompt mix one launch against three and its tiles, CUDA graphs, bits compared); Flash Next's prefill in
# four rounds; the 35B-A3B's 8 x 1,024 prefill idle after LanesOnce and the gathered page-table writes
# (prefill_gaps.py without stacks). Carry .whl .whl-test .devk.
. .dev/start.sh
timeout 120 python .dev/hyper_prompt_sweep.py 2>&1 | grep -v "arn" | tee $R/sweep.txt | cut -c1-400
echo "sweep t=$(el)"
G=tfd_kernels.gemm_plan.NARROW_WHOLE_PROGRAMS H=tfd_kernels.hyper.MIX_PROMPT_SPLIT
timeout $(( 200 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 8 --rounds 4 \
  --variant base= --variant n100=$G=100 --variant split=$H=1 --out $R/fn > $R/fn.txt 2>&1
echo "fn rc=$? t=$(el)"; grep -a "prefill\|rror\|NOT\|differ" $R/fn.txt | cut -c1-300
prefill_idle
cd $OUT && tar czf r.tgz r && rm -rf r

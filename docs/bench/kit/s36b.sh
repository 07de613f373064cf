#!/usr/bin/env bash
# Issue 31: the MoE's prompt launches swept (moe_sweep.py): Triton's cache warmed by four compiling processes,
# then every variant timed in one. ~300 s. Carry .whl .whl-test .dev.
. .dev/start.sh
for i in 0 1 2 3; do timeout 300 python .dev/moe_sweep.py compile 4 $i > $R/compile$i.txt 2>&1 & done; wait
echo "compiled t=$(el)"; grep -h "fails\|rror" $R/compile*.txt | head -5
timeout $(( 560 - $(el) )) python .dev/moe_sweep.py time 2>&1 | tee $R/moe_sweep.txt | cut -c1-200
echo "t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Issue 31: moe_sweep.py's second round (around the first round's best) on the card at hand. ~60 s.
. .dev/start.sh
V="base best b_gs4 b_dn128s4 b_dn128s5 b_ds4 b_group16 b_group8 b_dn128w4 b_gk32s6 b_dk32s6 b_m64gs4 b_gn64s4 b_gs4ds4"
for i in 0 1 2 3; do timeout 300 python .dev/moe_sweep.py compile 4 $i $V > $R/compile$i.txt 2>&1 & done; wait
echo "compiled t=$(el)"; grep -h "fails\|rror" $R/compile*.txt | head -5
timeout $(( 560 - $(el) )) python .dev/moe_sweep.py time $V 2>&1 | grep -v arn | tee $R/moe_sweep2.txt | cut -c1-200
echo "t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

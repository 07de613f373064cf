#!/usr/bin/env bash
# Fortieth session's third call (an H100, warm): issue 31's prefill benches with the whole-form tile 128 x 128 x
# 64 in 4 stages (the tree's, from s40b's sweep) against 128 x 128 x 128 in 3 (before), one after the other a
# shape, the old first: the MoE shapes' 8 x 1,024 and Flash Next's 1 x 1,024, two rounds each. ~540 s.
# Carry .whl .whl-test .dev.
. .dev/start.sh
P=/tmp/site/tfd_kernels/gemm_plan.py
old() { sed -i 's/^WHOLE = Tiles(128, 128, 64, 8, 4)$/WHOLE = Tiles(128, 128, 128, 8, 3)/' $P; }
new() { sed -i 's/^WHOLE = Tiles(128, 128, 128, 8, 3)$/WHOLE = Tiles(128, 128, 64, 8, 4)/' $P; }
for s in qwen3_5-35b-a3b:8 qwen3_8-flash-next:1 qwen3_next-80b-a3b:8; do
  for v in old new; do
    [ $(el) -lt 480 ] || break
    $v; echo "$v: $(grep '^WHOLE =' $P)"
    timeout $(( 560 - $(el) )) tfd bench --shape ${s%:*} --streams ${s#*:} --prompt 1024 --new 8 --rounds 2 \
      --out $R/$v-${s%:*} 2>&1 | grep -a "prefill\|rror" | cut -c1-300
    echo "t=$(el)"
  done
done
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Thirty-ninth session's issue 34 call (an H200; not run: the budget went to refused starts and an H100): the
# FP8 one-row products' tiles and segments (fp8_stages.py, ~20 s warm; the 32-column A/B left out since it lost
# on the H100 in the fortieth session), then the acceptance runs: the 9B in
# FP8 and bf16 at 1 and 32 streams, the 35B-A3B in FP8 at one stream (1,024-token prompts, 256 new). ~500 s.
# Carry .whl .whl-test .dev.
. .dev/start.sh
timeout 150 python .dev/fp8_stages.py 2>&1 | grep -v "arn" | tee $R/fp8-stages.txt | cut -c1-400
echo "stages t=$(el)"
for d in fp8 bfloat16; do
  [ $(el) -lt 400 ] || break
  timeout $(( 440 - $(el) )) tfd bench --shape qwen3_5-9b --dtype $d --streams 1,32 --prompt 1024 --new 256 \
    --out $R/9b-$d > $R/9b-$d.txt 2>&1; echo "9b $d rc=$? t=$(el)"; grep -a "qwen3_5\|rror" $R/9b-$d.txt | cut -c1-300
done
[ $(el) -lt 480 ] && timeout $(( 570 - $(el) )) tfd bench --shape qwen3_5-35b-a3b --dtype fp8 --streams 1 --prompt 1024 \
  --new 256 --out $R/35b-fp8 > $R/35b-fp8.txt 2>&1; echo "35b fp8 rc=$? t=$(el)"
grep -a "qwen3_5\|rror" $R/35b-fp8.txt | cut -c1-300
cd $OUT && tar czf r.tgz r && rm -rf r

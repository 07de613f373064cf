#!/usr/bin/env bash
# Forty-eighth session (~360 s, any card): issue 33's grammar bar after 53cb759 (fill_ahead hands the GIL to
# the grammar thread and returns once the fill has begun) and the takes left to the next fill (TAKE_LATER:
# a lane's take reads its mask's bit; llguidance steps every lane's token at the fill's start, on the grammar
# thread). First the grammar lanes' GPU tests (the redraw graph's tokens against the eager draw); then the demo
# at 32 and 1 streams and the 9B shape at 32, plain and with a JSON grammar on every lane, three variants
# interleaved in one process: both on, the handoff alone, both off (three rounds on the demo, two on the 9B).
# The bar: json's step at most 1.10x plain's. Carry .whl .whl-test .devk .devcache.
. .dev/start.sh
LIMIT=${LIMIT:-360}
gpu_tests 80 2 -rE tests/engine/test_grammar_lanes.py tests/engine/test_grammar_masks.py
V="--variant on= --variant handoff=tfd.engine.grammar.TAKE_LATER=0"
V="$V --variant off=tfd.engine.grammar.TAKE_LATER=0,tfd.engine.grammar.FILL_HANDOFF=0"
timeout $(( LIMIT / 2 )) tfd bench --streams 32,1 --prompt 1024 --new 256 --grammar none,json --rounds 3 $V \
  --out $R/demo > $R/demo.txt 2>&1
echo "demo rc=$? t=$(el)"; grep -a "step\|rror" $R/demo.txt | cut -c1-250
timeout $(( LIMIT - 15 - $(el) )) tfd bench --shape qwen3_5-9b --streams 32 --prompt 1024 --new 128 \
  --grammar none,json --rounds 2 $V --out $R/9b > $R/9b.txt 2>&1
echo "9b rc=$? t=$(el)"; grep -a "step\|rror" $R/9b.txt | cut -c1-250
cd $OUT && tar czf r.tgz r && rm -rf r

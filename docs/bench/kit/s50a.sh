#!/usr/bin/env bash
# Forty-eighth session (~300 s, any card): issue 33's grammar bar after 53cb759 (fill_ahead hands the GIL to
# the grammar thread and returns once the fill has begun, so the engine thread's bookkeeping overlaps it):
# the demo at 32 and 1 streams, then the 9B shape at 32, plain and with a JSON grammar on every lane, the
# handoff on and off interleaved in one process (`--variant`, three rounds on the demo, two on the 9B). The bar:
# json's step at most 1.10x plain's. Carry .whl .whl-test .devk.
. .dev/start.sh
LIMIT=${LIMIT:-300}
timeout $(( LIMIT / 2 )) tfd bench --streams 32,1 --prompt 1024 --new 256 --grammar none,json --rounds 3 \
  --variant on= --variant off=tfd.engine.grammar.FILL_HANDOFF=0 --out $R/demo > $R/demo.txt 2>&1
echo "demo rc=$? t=$(el)"; grep -a "step\|rror" $R/demo.txt | cut -c1-250
timeout $(( LIMIT - 15 - $(el) )) tfd bench --shape qwen3_5-9b --streams 32 --prompt 1024 --new 128 \
  --grammar none,json --rounds 2 --variant on= --variant off=tfd.engine.grammar.FILL_HANDOFF=0 --out $R/9b \
  > $R/9b.txt 2>&1
echo "9b rc=$? t=$(el)"; grep -a "step\|rror" $R/9b.txt | cut -c1-250
cd $OUT && tar czf r.tgz r && rm -rf r

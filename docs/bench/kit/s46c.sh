#!/usr/bin/env bash
# Forty-fourth session, on an H200 (issue 31's card) with QSA's decode segments on by default: Flash Next's
# acceptance runs (1, 8 and 32 streams, 1,024-token prompts, 256 new), then one stream at a 32,768-token prompt
# and at 1,024 in one run (decode at 32k against 1k; issue 31 asks 85%). ~480 s. Carry .whl .whl-test .devk.
. .dev/start.sh
timeout $(( 300 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1,8,32 --prompt 1024 --new 256 \
  --out $R/fn > $R/fn.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/fn.txt | cut -c1-300
for p in 32768 1024; do
  timeout $(( 470 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt $p --new 64 --out $R/long \
    > $R/long-$p.txt 2>&1; echo "long $p rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/long-$p.txt | cut -c1-300
done
cd $OUT && tar czf r.tgz r && rm -rf r

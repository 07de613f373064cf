#!/usr/bin/env bash
# Forty-ninth session's second call (any card, ~300 s): where the prefill's time goes for issue 31's two bars
# still short: qwen3_next-80b-a3b at 8 x 1,024 (30.6% of the matmul rate on the H100, bar 35%) and Flash Next at
# one stream (8.2%), kernel by kernel (`--profile`). Carry .whl .whl-test .devk.
. .dev/start.sh
timeout 150 tfd bench --shape qwen3_next-80b-a3b --streams 8 --prompt 1024 --new 8 --profile --out $R/next \
  > $R/next.txt 2>&1; echo "next rc=$? t=$(el)"; grep -a "prefill\|rror" $R/next.txt | cut -c1-300
f=$(ls $R/next/*prefill.txt 2>/dev/null | head -1); [ -n "$f" ] && head -45 $f | cut -c1-120
timeout $(( 290 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 8 --profile \
  --out $R/fn > $R/fn.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "prefill\|rror" $R/fn.txt | cut -c1-300
f=$(ls $R/fn/*prefill.txt 2>/dev/null | head -1); [ -n "$f" ] && head -45 $f | cut -c1-120
cd $OUT && tar czf r.tgz r && rm -rf r

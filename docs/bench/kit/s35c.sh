#!/usr/bin/env bash
# A last short call: on an H200, resume_serve.sh (issue 36's page-cache point, ~120 s); elsewhere Flash Next's
# 1 x 1,024 prefill at the committed defaults (PROMPT_PAIRS=16), two rounds. Carry .whl .whl-test .dev.
. .dev/start.sh
case "$CARD" in *H200*) ;; *) timeout 100 tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 8 \
  --rounds 2 --out $R 2>&1 | grep -a "prefill\|rror" | cut -c1-300;; esac
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Forty-ninth session (any card, ~560 s): issue 31's bars at HEAD on whatever card comes (s49a.sh runs them only
# on an H200): Flash Next --streams 1,8,32 --new 256, the MoE shapes' 8 x 1,024 prefill, one stream at 32,768
# against 1,024. Carry .whl .whl-test .devk.
. .dev/start.sh
LIMIT=${LIMIT:-560}
issue31_bars "qwen3_5-35b-a3b qwen3_next-80b-a3b" 80 50 long
cd $OUT && tar czf r.tgz r && rm -rf r

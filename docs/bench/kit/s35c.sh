#!/usr/bin/env bash
# A last short call: on an H200, resume_serve.sh (issue 36's page-cache point, ~120 s); elsewhere Flash Next's
# 1 x 1,024 prefill at the committed defaults (PROMPT_PAIRS=16), two rounds. Carry .whl .whl-test .dev.
set -u
bash .dev/install.sh .whl-test > /dev/null 2>&1 || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$CARD"
case "$CARD" in
  *H200*) mkdir -p $OUT/rs; OUT=$OUT/rs bash .dev/resume_serve.sh 2>&1 | grep -a "resume c32\|read back\|rc=\|READY" \
    | cut -c1-300;;
  *) mkdir -p $OUT/r; timeout 100 tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 8 --rounds 2 \
    --out $OUT/r 2>&1 | grep -a "prefill\|rror" | cut -c1-300;;
esac

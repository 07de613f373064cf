#!/usr/bin/env bash
# Thirty-fifth session, second start: on an H200, resume_serve.sh first (issue 36's page-cache point); then
# Flash Next's one-lane 1,024-row prefill with the MoE's prompt tiles (issue 31: 512 experts take 20 pairs
# each, under PROMPT_PAIRS, so 16-row tiles, two an expert, each reading the expert's weights): 32-row
# prompt tiles from 16 pairs an expert (one tile an expert), and 64-row ones; two rounds, tokens compared
# (tile rows change no bits). ~200 s after the start on an H100. Carry .whl .whl-test .dev.
. .dev/start.sh
M=tfd_kernels.moe
timeout $(( 560 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 8 --rounds 2 \
  --variant base= --variant m32=$M.PROMPT_PAIRS=16,$M.PROMPT_M=32 --variant m64=$M.PROMPT_PAIRS=16 \
  --variant m32w4=$M.PROMPT_PAIRS=16,$M.PROMPT_M=32,$M.PROMPT_WARPS=4 --out $R 2>&1 \
  | grep -a "best of\|rror" | cut -c1-300
echo "t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Thirty-fifth session: issue 36's page-cache point on the H200 (resume_serve.sh, the card its acceptance
# names; skipped elsewhere), then issue 31's prefill with the new defaults (gdn_chunk.REFINED,
# moe.PROMPT_GROUP=32) on the card at hand: 35B-A3B and Qwen3-Next-80B-A3B 8 x 1,024, Flash Next 1 x 1,024,
# two rounds each, the JSON under $OUT. ~420 s after the start. Carry .whl .whl-test .dev.
. .dev/start.sh
prefill_benches 480 570
echo "t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

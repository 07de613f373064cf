#!/usr/bin/env bash
# Forty-ninth session's third call (~420 s on an H200, ~280 s on any other card). On an H200 first issue 31's
# bars (s51a.sh's steps). Then, any card: the grammar lanes' GPU tests (jsonschema now carried in .whl-test);
# issue 33's demo step at 32 streams with a JSON grammar and plain, its host parts timed (grammar_timeline.py);
# issue 31's MoE prompt tiles of 256 pairs (an expert's weights read once a column where its pairs fit one
# tile: Qwen3-Next-80B-A3B's 8 x 1,024 prefill averages 160 pairs an expert, 62% of two 128-pair tiles) against
# the defaults, the same bits asked, on both MoE shapes. Carry .whl .whl-test .devk .devcache.
. .dev/start.sh
case "$CARD" in *H200*) LIMIT=330 bash .dev/s51a.sh; mkdir -p $R/bars; [ -f $OUT/r.tgz ] && mv $OUT/r.tgz $R/bars/ ;; esac
gpu_tests 80 2 -rE tests/engine/test_grammar_lanes.py tests/engine/test_grammar_masks.py
for g in json none; do
  timeout 70 python .dev/grammar_timeline.py --streams 32 --prompt 1024 --new 256 --grammar $g --out $R/timeline-$g \
    > $R/timeline-$g.txt 2>&1; echo "timeline $g rc=$? t=$(el)"; grep -a "step\|TIMELINE\|rror" $R/timeline-$g.txt | cut -c1-1500
done
M="tfd_kernels.moe"
for s in qwen3_next-80b-a3b qwen3_5-35b-a3b; do
  for v in "m256=$M.PROMPT_M=256,$M.PROMPT_GATE_STAGES=3,$M.PROMPT_DOWN_N=128,$M.PROMPT_DOWN_STAGES=3" \
           "m256g64=$M.PROMPT_M=256,$M.PROMPT_GATE_N=64,$M.PROMPT_DOWN_N=128,$M.PROMPT_DOWN_STAGES=3"; do
    timeout 80 tfd bench --shape $s --streams 8 --prompt 1024 --new 8 --rounds 3 --variant base= --variant "$v" \
      --out $R/$s-${v%%=*} > $R/$s-${v%%=*}.txt 2>&1
    echo "$s ${v%%=*} rc=$? t=$(el)"; grep -a "prefill\|rror" $R/$s-${v%%=*}.txt | cut -c1-250
  done
done
cd $OUT && tar czf r.tgz r && rm -rf r

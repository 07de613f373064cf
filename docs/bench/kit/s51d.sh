#!/usr/bin/env bash
# s51c.sh within LIMIT seconds (default 320; each step starts only if its least time is left): on an H200
# issue 31's bars first (Flash Next --streams 1,8,32 --new 256, the 80B-A3B's then the 35B-A3B's 8 x 1,024
# prefill); then, any card: issue 33's demo step at 32 streams with a JSON grammar, its host parts timed
# (grammar_timeline.py); the MoE prompt tiles of 256 pairs against the defaults on the 80B-A3B and the 35B-A3B
# (the same bits asked); the demo's plain step timed alike; the grammar lanes' GPU tests. Carry .whl .whl-test
# .devk .devcache.
. .dev/start.sh
LIMIT=${LIMIT:-320}
case "$CARD" in *H200*) issue31_bars "qwen3_next-80b-a3b qwen3_5-35b-a3b" 60 40 ;; esac
timeline() {
  t=$(budget 70 40); [ $t -gt 0 ] || return
  timeout $t python .dev/grammar_timeline.py --streams 32 --prompt 1024 --new 256 --grammar $1 --out $R/timeline-$1 \
    > $R/timeline-$1.txt 2>&1; echo "timeline $1 rc=$? t=$(el)"; grep -a "step\|TIMELINE\|rror" $R/timeline-$1.txt | cut -c1-1500
}
timeline json
M="tfd_kernels.moe"
for s in qwen3_next-80b-a3b qwen3_5-35b-a3b; do
  v="m256=$M.PROMPT_M=256,$M.PROMPT_GATE_STAGES=3,$M.PROMPT_DOWN_N=128,$M.PROMPT_DOWN_STAGES=3"
  t=$(budget 70 45); [ $t -gt 0 ] || break
  timeout $t tfd bench --shape $s --streams 8 --prompt 1024 --new 8 --rounds 3 --variant base= --variant "$v" \
    --out $R/$s-m256 > $R/$s-m256.txt 2>&1
  echo "$s m256 rc=$? t=$(el)"; grep -a "prefill\|rror" $R/$s-m256.txt | cut -c1-250
done
timeline none
t=$(budget 60 40); [ $t -gt 0 ] && gpu_tests $t 2 -rE tests/engine/test_grammar_lanes.py tests/engine/test_grammar_masks.py
cd $OUT && tar czf r.tgz r && rm -rf r

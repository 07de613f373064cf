#!/usr/bin/env bash
# Fiftieth session's first call (~300 s, any card): issue 33's demo step with the owed tokens stepped as the
# engine thread makes a fill ready (grammar_masks.OWED_FIRST: the grammar thread's one call waits for the GIL once),
# against them stepped on the grammar thread (0906b45) and the fill begun after the takes (af8b58e), and the GIL's
# switch interval at 20 us while a fill is in flight (grammar_masks.FILL_SWITCH_US), with the handoff and without, and
# the fill made at once on the engine thread (grammar_masks.FILL_ON_THREAD=0: no handoff, no overlap): the
# demo at 32 and 1 streams, plain and JSON on every lane, the variants interleaved; then the json step's host
# parts timed (grammar_timeline.py), and its engine-thread parts without a model (grammar_host.py). Carry .whl .whl-test .devk .devcache.
. .dev/start.sh
LIMIT=${LIMIT:-300}
G=tfd.engine.grammar_masks
V="--variant on= --variant owed=$G.OWED_FIRST=0 --variant after=tfd.engine.grammar.JUDGE_AHEAD=0 --variant switch=$G.FILL_SWITCH_US=20
  --variant switch-free=$G.FILL_SWITCH_US=20,$G.FILL_HANDOFF=0 --variant sync=$G.FILL_ON_THREAD=0"
grammar_demo "$V" 70
grammar_timeline 50 40
for v in "" OWED_FIRST=0 FILL_ON_THREAD=0 FILL_SWITCH_US=20; do  # the engine thread's parts, no model (~10 s each)
  t=$(( LIMIT - 5 - $(el) )); [ $t -ge 12 ] || break
  echo "host ${v:-on}: $(GRAMMAR_SET=$v timeout $t python .dev/grammar_host.py 2>&1 | tail -1)"
done
cd $OUT && tar czf r.tgz r && rm -rf r

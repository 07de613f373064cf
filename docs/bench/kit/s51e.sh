#!/usr/bin/env bash
# Forty-ninth session's last call (~200 s, any card): issue 33's demo step after the grammar's judge (a step's
# tokens taken on their masks' bits as soon as they are on the host, the next fill begun before the lanes'
# takes; two mask buffers in turn): the demo at 32 and 1 streams, plain and JSON on every lane, three variants
# interleaved: on, the judge off (the fill after the takes, as at af8b58e), the takes on the engine thread
# (TAKE_LATER=0); then the json step's host parts timed (grammar_timeline.py, go_on's parts too) and the
# grammar lanes' GPU tests if time is left. Carry .whl .whl-test .devk .devcache.
. .dev/start.sh
LIMIT=${LIMIT:-200}
V="--variant on= --variant after=tfd.engine.grammar.JUDGE_AHEAD=0 --variant handoff=tfd.engine.grammar.TAKE_LATER=0"
grammar_demo "$V" 15
grammar_timeline 10 45
t=$(( LIMIT - 10 - $(el) )); [ $t -ge 45 ] && gpu_tests $t 2 -rE tests/engine/test_grammar_lanes.py
cd $OUT && tar czf r.tgz r && rm -rf r

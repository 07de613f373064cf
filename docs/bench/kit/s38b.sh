#!/usr/bin/env bash
# Thirty-eighth session: issue 33's demo half with the lanes' matchers taking a step's tokens on the grammar
# thread with the next masks' fill (take_ahead) against before (the three engine files of df21f56, .dev/old/,
# laid over a copy of the install), alternated twice; then grammar_threads.py (does llguidance's fill spread
# over this host's cores?) and the x32 json timeline. ~300 s. Carry .whl .whl-test .dev .devcache.
. .dev/start.sh
mkdir -p /tmp/old && cp -r /tmp/site/tfd /tmp/old/ && cp .dev/old/*.py /tmp/old/tfd/engine/
for round in 1 2; do
  for which in new old; do
    [ $which = old ] && P=/tmp/old:/tmp/site || P=/tmp/site
    PYTHONPATH=$P timeout 100 tfd bench --streams 32,1 --prompt 1024 --new 256 --grammar none,json \
      --out $R/demo-$which-$round > $R/demo-$which-$round.txt 2>&1
    echo "$which $round rc=$? t=$(el)"; grep -a "tok/s" $R/demo-$which-$round.txt | cut -c1-200
  done
done
timeout 120 python .dev/grammar_threads.py > $R/grammar-threads.txt 2>&1; echo "threads rc=$? t=$(el)"
grep -a "one call\|a lane" $R/grammar-threads.txt
timeout 60 python .dev/grammar_timeline.py --streams 32 --prompt 1024 --new 128 --grammar json \
  --out $R/demo-x32-json > $R/demo-x32-json.txt 2>&1; echo "timeline rc=$? t=$(el)"
grep -a TIMELINE $R/demo-x32-json.txt | python -c "import json,sys; d=json.loads(sys.stdin.read()[9:]); print({k: v['median'] if isinstance(v, dict) else v for k, v in d.items()})"
cd $OUT && tar czf r.tgz r && rm -rf r

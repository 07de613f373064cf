#!/usr/bin/env bash
# Thirty-seventh session, first call: issue 31's prefill idle and three benches after the lanes' cheaper
# opening (s36i.sh's body), then issue 33's demo half: the demo x32 and x1 with and without the JSON grammar
# (tfd bench) and the demo x32/x1 json step's parts (grammar_timeline.py). ~330 s. Carry .whl .whl-test .dev.
. .dev/start.sh
prefill_idle
prefill_benches 300 400
echo "prefill t=$(el)"
timeout 120 tfd bench --streams 32,1 --prompt 1024 --new 256 --grammar none,json --out $R/demo > $R/demo.txt 2>&1
echo "demo rc=$? t=$(el)"; grep -a "tok/s" $R/demo.txt | cut -c1-250
for s in 32 1; do
  [ $(el) -lt 540 ] || break
  timeout 60 python .dev/grammar_timeline.py --streams $s --prompt 1024 --new 128 --grammar json \
    --out $R/demo-x$s-json > $R/demo-x$s-json.txt 2>&1; echo "timeline x$s rc=$? t=$(el)"
  grep -a TIMELINE $R/demo-x$s-json.txt | python -c "import json,sys; d=json.loads(sys.stdin.read()[9:]); print({k: v['median'] if isinstance(v, dict) else v for k, v in d.items()})"
done
cd $OUT && tar czf r.tgz r && rm -rf r

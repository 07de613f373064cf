#!/usr/bin/env bash
# Thirty-seventh session: issue 33's demo half after the grammar rows' redraw became a graph a bucket:
# the GPU grammar tests, the demo x32/x1 json against none (tfd bench), then the demo x32 json decode
# sampled by py-spy (every thread, idle samples kept, raw collapsed stacks). ~200 s.
# Carry .whl .whl-test (py-spy, jsonschema) .dev .devcache (the tiny-head checkpoint prebuilt).
. .dev/start.sh
TMPDIR=$PWD/.devcache timeout 200 python -m pytest -q -m gpu -p no:cacheprovider -p no:benchmark -W ignore::DeprecationWarning tests/engine/test_grammar_lanes.py 2>&1 | tail -4
echo "tests t=$(el)"
timeout 120 tfd bench --streams 32,1 --prompt 1024 --new 256 --grammar none,json --out $R/demo > $R/demo.txt 2>&1
echo "demo rc=$? t=$(el)"; grep -a "tok/s" $R/demo.txt | cut -c1-250
timeout 150 py-spy record -r 2000 --idle --threads --format raw -o $R/demo-json.raw -- \
  tfd bench --streams 32 --prompt 1024 --new 1024 --grammar json > $R/demo-json.txt 2>&1
echo "spy rc=$? t=$(el)"; grep -a "tok/s" $R/demo-json.txt | cut -c1-250; ls -la $R/demo-json.raw
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Thirty-seventh session: issue 33's demo half after a step's inputs are packed through numpy and made
# ready before the wait for the masks: the GPU tests of the grammar lanes and the device path (graphs
# against eager), the demo x32/x1 json against none, then py-spy (non-blocking, 500 Hz) of the demo x32
# json decode. ~200 s. Carry .whl .whl-test (py-spy, jsonschema) .dev .devcache (tiny checkpoints prebuilt).
. .dev/start.sh
python -c "import numpy; print('numpy', numpy.__version__)"
TMPDIR=$PWD/.devcache timeout 200 python -m pytest -q -m gpu -p no:cacheprovider -p no:benchmark \
  -W ignore::DeprecationWarning tests/engine/test_grammar_lanes.py tests/engine/test_device_path.py \
  -k "not wide and not two-streams" 2>&1 | tail -4
echo "tests t=$(el)"
timeout 120 tfd bench --streams 32,1 --prompt 1024 --new 256 --grammar none,json --out $R/demo > $R/demo.txt 2>&1
echo "demo rc=$? t=$(el)"; grep -a "tok/s" $R/demo.txt | cut -c1-250
timeout 150 py-spy record -r 500 --nonblocking --idle --threads --format raw -o $R/demo-json.raw -- \
  tfd bench --streams 32 --prompt 1024 --new 2048 --grammar json > $R/demo-json.txt 2>&1
echo "spy rc=$? t=$(el)"; grep -a "tok/s" $R/demo-json.txt | cut -c1-250
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Thirty-seventh session, last call: the GPU tests after an fp32 prompt pass of the MoE took back its old
# tiles (the sweep's need 256-384 KB of shared memory at 4 bytes an element) and a decode step's inputs
# are packed through numpy ahead of the mask wait: the device path (fp32 greedy == CPU among them), the
# MoE, drafting (rounds' inputs packed the same way) and the grammar lanes; then the demo json/none.
# ~250 s. Carry .whl .whl-test .dev .devcache (tiny checkpoints prebuilt).
. .dev/start.sh
TMPDIR=$PWD/.devcache timeout 300 python -m pytest -q -m gpu -n 4 -p no:cacheprovider -p no:benchmark \
  -W ignore::DeprecationWarning tests/engine/test_device_path.py tests/kernels/test_moe_gpu.py \
  tests/engine/test_drafting.py tests/engine/test_grammar_lanes.py -k "not wide and not two-streams" 2>&1 \
  | tee $R/gpu-tests.txt | grep -a "passed\|failed\|FAILED\|Error" | cut -c1-250 | tail -12
echo "tests t=$(el)"
timeout 100 tfd bench --streams 32,1 --prompt 1024 --new 256 --grammar none,json --out $R/demo > $R/demo.txt 2>&1
echo "demo rc=$? t=$(el)"; grep -a "tok/s" $R/demo.txt | cut -c1-250
cd $OUT && tar czf r.tgz r && rm -rf r

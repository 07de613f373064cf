#!/usr/bin/env bash
# The next session's first device call (issues 34 and 36): the 9B shape in FP8 then bf16 at 1 and 32 streams
# after the decode rows' quantize moved into the kernels that make them (fp8_quick.sh, 240 s, its GPU tests
# first among them tests/model/test_fp8_rows_gpu.py: the same tokens as the separate launches), then the
# identity probe's fix checked (flake4.sh: 10 starts with graphs, 4 without, one probe state expected).
# Carry .whl .whl-test .dev (no checkpoints: the tests draw their model).
T0=$(date +%s)
LIMIT=240 bash .dev/fp8_quick.sh; echo "fp8_quick t=$(( $(date +%s) - T0 ))"
[ -f $OUT/r.tgz ] && mv $OUT/r.tgz $OUT/fp8.tgz
timeout $(( 590 - $(date +%s) + T0 )) bash .dev/flake4.sh; echo "flake4 t=$(( $(date +%s) - T0 ))"

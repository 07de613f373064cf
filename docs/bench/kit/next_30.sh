#!/usr/bin/env bash
# The next session's first device call (issues 34 and 36), in the order of what is worth most if the call is
# cut short: the 9B shape in FP8 then bf16 at 1 and 32 streams after the FP8 changes of 2026-12-05 (segments
# for one program a multiprocessor; quantize's masked lanes dividing a one), then the identity probe's
# bisection (identity_flake.sh), then probe_gpu.py's three modes. Carry .whl .whl-test .dev .devcache.
T0=$(date +%s)
LIMIT=200 bash .dev/fp8_quick.sh; echo "fp8_quick t=$(( $(date +%s) - T0 ))"
[ -f $OUT/r.tgz ] && mv $OUT/r.tgz $OUT/fp8.tgz
timeout $(( 500 - $(date +%s) + T0 )) bash .dev/identity_flake.sh; echo "flake t=$(( $(date +%s) - T0 ))"
export PYTHONPATH=/tmp/site TRITON_CACHE_DIR=/tmp/triton
timeout $(( 580 - $(date +%s) + T0 )) python .dev/probe_gpu.py 2>&1 | grep -v Warning | tail -20

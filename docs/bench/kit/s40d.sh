#!/usr/bin/env bash
# Fortieth session: on an H200, issue 31's acceptance runs, s39a.sh without its GPU tests (they passed on the
# H100 in s40b): Flash Next at 1, 8 and 32 streams (1,024-token prompts, 256 new), then the MoE shapes' 8 x 1,024
# prefill, two rounds. On an H100: s40c.sh (the whole-form tiles at the three prefill benches; ran). ~560 s.
# Carry .whl .whl-test .dev.
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash .dev/s40c.sh; fi
TESTS=0 exec bash .dev/s39a.sh

#!/usr/bin/env bash
# Forty-first session, first call: on an H200, issue 31's acceptance runs (s39a.sh without its GPU tests:
# Flash Next at 1, 8 and 32 streams, the MoE shapes' 8 x 1,024 prefill); on an H100, s41a.sh (the swapped
# few-row FP8 form's GPU bits tests, its stages, the 9B in FP8 with and without it). ~560 s.
# Carry .whl .whl-test .devk .devcache.
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash .dev/s41a.sh; fi
TESTS=0 exec bash .dev/s39a.sh

#!/usr/bin/env bash
# Forty-fourth session, second call: s45d.sh's drafting GPU tests again with the segments on (six errored: the
# tiny Flash Next checkpoint with a head was not in .devcache), the errors named; then s46a.sh's prefill
# variants and the 35B-A3B's prefill gaps. ~420 s. Carry .whl .whl-test .devk .devcache.
. .dev/start.sh
export PYTHONPATH=$PYTHONPATH:$PWD/.dev  # segments_on.py
gpu_tests 110 8 -rE -p segments_on tests/engine/test_drafting.py tests/kernels/test_gemm.py -k "(not qwen3 and not 9b) or many_rows"
grep -a "^ERROR\|^E  " $R/gpu-tests.txt | cut -c1-200 | head -8
sed -i 's/^gpu_tests/: gpu_tests/' .dev/s46a.sh  # run above
bash .dev/s46a.sh

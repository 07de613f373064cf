#!/usr/bin/env bash
# s34a.sh cut to a smaller budget (the session's device time mostly spent on refused starts): on an H200
# resume_serve.sh first (issue 36's page-cache point on the card its acceptance names), then the GDN
# prefill's variants timed (gdn_sweep.py: base, refined, one-pass tf32) and its GPU test at real sizes
# (REAL_TOL, refined both ways), the tensor-parallel GPU test's new first-token rule; stops by 500 s.
# Carry .whl .whl-test .dev .devcache-tp.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh .whl-test > /dev/null 2>&1 || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$CARD"
case "$CARD" in *H200*) mkdir -p $OUT/rs; OUT=$OUT/rs bash .dev/resume_serve.sh 2>&1 | grep -a "resume c32\|read back\|rc=" \
  | cut -c1-300; echo "resume t=$(el)";; esac
timeout 120 python .dev/gdn_sweep.py base refined tf32 2>&1 | tee $R/gdn_sweep.txt | cut -c1-300; echo "sweep t=$(el)"
[ $(el) -lt 330 ] && TMPDIR=$PWD/.devcache-tp timeout $(( 500 - $(el) )) python -m pytest -q -m gpu -n 4 \
  -p no:cacheprovider -p no:benchmark -W ignore::DeprecationWarning tests/kernels/test_gdn_prefill.py \
  tests/model/test_tensor_parallel_gpu.py 2>&1 | tee $R/gpu_tests.txt | grep -a "passed\|failed\|^E " | head -12 \
  | cut -c1-250
echo "t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

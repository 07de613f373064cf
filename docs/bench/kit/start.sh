# Sourced by a call's script (`. .dev/start.sh`): the clock (`el`, seconds since the start), the serving stack
# installed from .whl and .whl-test, the environment that finds it, $R (results, tarred by the caller) and the
# card's name printed. Defines `prefill_benches`, `prefill_idle` and `gpu_tests` (below) for the calls. (Until
# issue 36 closed it also ran resume_serve.sh first on an H200.)
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh .whl-test > /dev/null 2>&1 || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$CARD"
# Issue 31's three prefill benches (the MoE shapes' 8 x 1,024, Flash Next's 1 x 1,024), two rounds each, the
# JSON under $R/SHAPE: none started $1 s or more after the start, each stopped $2 s after it.
prefill_benches() {
  for s in qwen3_5-35b-a3b:8 qwen3_next-80b-a3b:8 qwen3_8-flash-next:1; do
    [ $(el) -lt $1 ] || break
    timeout $(( $2 - $(el) )) tfd bench --shape ${s%:*} --streams ${s#*:} --prompt 1024 --new 8 --rounds 2 \
      --out $R/${s%:*} 2>&1 | grep -a "prefill\|rror" | cut -c1-300
  done
}
# Issue 31's 35B-A3B 8 x 1,024 prefill step's idle device time (prefill_gaps.py without stacks), the report
# under $R/gaps-after.txt and its head printed.
prefill_idle() {
  GAPS_STACKS=0 timeout 100 python .dev/prefill_gaps.py qwen3_5-35b-a3b 8 1024 $R 2>&1 | grep -v "arn\|^ *_warn" \
    | tee $R/gaps-after.txt | head -12 | cut -c1-200
  echo "gaps t=$(el)"
}
# The -m gpu tests named after its first two arguments (seconds, workers), the tiny checkpoints from .devcache
# (carry it), the log under $R/gpu-tests.txt and its verdict lines printed, then the clock.
gpu_tests() {
  local seconds=$1 workers=$2; shift 2
  TMPDIR=$PWD/.devcache timeout $seconds python -m pytest -q -m gpu -n $workers -p no:cacheprovider -p no:benchmark \
    -W ignore::DeprecationWarning "$@" 2>&1 | tee $R/gpu-tests.txt | grep -a "passed\|failed\|FAILED\|Error" \
    | cut -c1-250 | tail -12
  echo "tests t=$(el)"
}

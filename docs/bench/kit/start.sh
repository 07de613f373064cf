# Sourced by a call's script (`. .dev/start.sh`): the clock (`el`, seconds since the start), the serving stack
# installed from .whl and .whl-test, the environment that finds it, $R (results, tarred by the caller) and the
# card's name printed. Defines `prefill_benches`, `budget`, `issue31_bars`, `prefill_idle`, `gpu_tests`,
# `grammar_demo` and `grammar_timeline` (below) for the calls. (Until issue 36 closed it also ran resume_serve.sh
# first on an H200.)
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
# Seconds a step may run within $LIMIT: its cap ($1) or what is left, less 10 for the packing; 0 below $2.
budget() { local left=$(( LIMIT - 10 - $(el) )); [ $left -ge $2 ] || { echo 0; return; }; echo $(( left < $1 ? left : $1 )); }
# Issue 31's bars at HEAD within $LIMIT: Flash Next --streams 1,8,32 --new 256 (JSON under $R/fn), the MoE shapes
# named in $1 (in that order) at 8 x 1,024, two rounds, each capped at $2 s and begun only with $3 s left, then,
# with $4 "long", one stream at 32,768 against 1,024 (under $R/long).
issue31_bars() {
  local t s p
  t=$(budget 130 60); [ $t -gt 0 ] && { timeout $t tfd bench --shape qwen3_8-flash-next --streams 1,8,32 \
    --prompt 1024 --new 256 --out $R/fn > $R/fn.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/fn.txt | cut -c1-300; }
  for s in $1; do
    t=$(budget $2 $3); [ $t -gt 0 ] || break
    timeout $t tfd bench --shape $s --streams 8 --prompt 1024 --new 8 --rounds 2 --out $R/$s > $R/$s.txt 2>&1
    echo "$s rc=$? t=$(el)"; grep -a "prefill\|rror" $R/$s.txt | cut -c1-300
  done
  [ "${4:-}" = long ] || return 0
  for p in 32768 1024; do
    t=$(budget 110 50); [ $t -gt 0 ] || break
    timeout $t tfd bench --shape qwen3_8-flash-next --streams 1 --prompt $p --new 64 --out $R/long \
      > $R/long-$p.txt 2>&1; echo "long $p rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/long-$p.txt | cut -c1-300
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
# Issue 33's demo decode step at 32 and 1 streams, plain and JSON on every lane, three rounds, the --variant flags
# in $1 interleaved (JSON under $R/demo), stopped $2 s before $LIMIT.
grammar_demo() {
  timeout $(( LIMIT - $2 - $(el) )) tfd bench --streams 32,1 --prompt 1024 --new 256 --grammar none,json --rounds 3 \
    $1 --out $R/demo > $R/demo.txt 2>&1
  echo "demo rc=$? t=$(el)"; grep -a "step\|rror" $R/demo.txt | cut -c1-250
}
# The demo's 32-lane JSON step's host parts (grammar_timeline.py, under $R/timeline-json), stopped $1 s before
# $LIMIT and begun only with $2 s or more to run.
grammar_timeline() {
  local t=$(( LIMIT - $1 - $(el) )); [ $t -ge $2 ] || return 0
  timeout $t python .dev/grammar_timeline.py --streams 32 --prompt 1024 --new 256 --grammar json \
    --out $R/timeline-json > $R/timeline-json.txt 2>&1; echo "timeline rc=$? t=$(el)"
  grep -a "step\|TIMELINE\|rror" $R/timeline-json.txt | cut -c1-2000
}

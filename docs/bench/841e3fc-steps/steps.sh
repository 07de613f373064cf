#!/usr/bin/env bash
# Issue 30 gate (a): the burst's TPOT against the step at TF_STEP_TOKENS 32768 and 16384, server and engine.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
python -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1 || { echo pip fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
cd /tmp
export TRITON_CACHE_DIR=/tmp/triton TF_ADMIN_SOCKET=/tmp/tfd-admin.sock
ready() {
  local start=$(date +%s)
  until python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null; do
    sleep 1; kill -0 $1 2>/dev/null || { echo "server died"; tail -30 $2; return 1; }
    [ $(( $(date +%s) - start )) -gt 200 ] && { echo "no READY"; tail -20 $2; return 1; }
  done
  echo "READY after $(( $(date +%s) - start )) s"
}
serve="--serve http://127.0.0.1:8000 --prompt 1024 --new 256 --no-drafts"
server_runs() {  # $1 step tokens, $2 label
  TF_STEP_TOKENS=$1 tfd serve --shape qwen3_5-9b > $R/serve-$2.log 2>&1 &
  local pid=$!
  ready $pid $R/serve-$2.log | tee $R/ready-$2.txt || return 1
  tfd bench $serve --concurrency 32 --requests 32 --no-warm --out $R/$2-first > $R/$2-first.txt 2>&1; tail -3 $R/$2-first.txt
  tfd bench $serve --concurrency 32 --requests 32 --no-warm --out $R/$2-burst > $R/$2-burst.txt 2>&1; tail -3 $R/$2-burst.txt
  tfd bench $serve --concurrency 32 --requests 128 --out $R/$2-replaced > $R/$2-replaced.txt 2>&1; tail -3 $R/$2-replaced.txt
  [ "$2" = s32768 ] && { tfd bench $serve --concurrency 1 --requests 4 --out $R/$2-one > $R/$2-one.txt 2>&1; tail -3 $R/$2-one.txt; }
  kill -TERM $pid; wait $pid
  grep -v tfd.access $R/serve-$2.log > $R/f && mv $R/f $R/serve-$2.log
  grep -n 'compiled while serving\|warm-up (\|planned\|pool' $R/serve-$2.log | cut -c1-260 | head -8
  echo "t=$(el)"
}
server_runs 32768 s32768
server_runs 16384 s16384
for n in 32768 16384; do
  timeout 150 tfd bench --shape qwen3_5-9b --streams 32 --prompt 1024 --new 256 --step-tokens $n --temperature 0 \
    --out $R/engine-$n > $R/engine-$n.txt 2>&1; tail -4 $R/engine-$n.txt; echo "t=$(el)"
done
if [ $(el) -lt 470 ]; then  # warm the default's variants too, for the soak that follows
  tfd serve --shape qwen3_5-9b > $R/serve-default.log 2>&1 & pid=$!
  ready $pid $R/serve-default.log; kill -TERM $pid; wait $pid; echo "t=$(el)"
fi
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
tar czf $OUT/triton.tgz -C /tmp triton; du -sh /tmp/triton $OUT/triton.tgz

#!/usr/bin/env bash
# Fresh start, the first 32 after READY and the same 32 again, then a restart with the Triton cache kept.
set -u
python -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
cd /tmp
export TRITON_CACHE_DIR=/tmp/triton TF_ADMIN_SOCKET=/tmp/tfd-admin.sock
ready() {
  local start=$(date +%s)
  until python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null; do
    sleep 1; kill -0 $1 2>/dev/null || { echo "server died"; tail -30 $2; exit 1; }
  done
  echo "READY after $(( $(date +%s) - start )) s"
}
burst="--serve http://127.0.0.1:8000 --prompt 1024 --new 256 --no-drafts --concurrency 32 --requests 32 --no-warm"
tfd serve --shape qwen3_5-9b > $OUT/fresh.log 2>&1 &
pid=$!; ready $pid $OUT/fresh.log | tee $OUT/fresh_ready.txt
tfd bench $burst --out $OUT/first > $OUT/first.txt 2>&1; tail -4 $OUT/first.txt
tfd bench $burst --out $OUT/again > $OUT/again.txt 2>&1; tail -4 $OUT/again.txt
kill -TERM $pid; wait $pid
grep -v tfd.access $OUT/fresh.log > $OUT/f && mv $OUT/f $OUT/fresh.log
grep -n 'compiled while serving\|warm-up (' $OUT/fresh.log | cut -c1-200
tfd serve --shape qwen3_5-9b > $OUT/restart.log 2>&1 &
pid=$!; ready $pid $OUT/restart.log | tee $OUT/restart_ready.txt
kill -TERM $pid; wait $pid
grep -n 'warm-up (\|captured' $OUT/restart.log | cut -c1-160

#!/usr/bin/env bash
# The 35B-A3B shape at the default TF_STEP_TOKENS: READY, a burst twice, then the engine at 32 streams.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
python -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1 || { echo pip fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
cd /tmp
tfd serve --shape qwen3_5-35b-a3b > $OUT/serve.log 2>&1 &
pid=$!
until python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null; do
  sleep 1; kill -0 $pid 2>/dev/null || { echo "server died"; grep -v tfd.access $OUT/serve.log | tail -20; exit 1; }
done
echo "READY at t=$(el)"; grep 'planned\|warm-up (' $OUT/serve.log | cut -c1-300
b="--serve http://127.0.0.1:8000 --prompt 1024 --new 256 --no-drafts --concurrency 32 --requests 32 --no-warm"
tfd bench $b --out $OUT/first 2>&1 | tail -1; echo "t=$(el)"
tfd bench $b --out $OUT/again 2>&1 | tail -1; echo "t=$(el)"
kill -TERM $pid; wait $pid
grep -v tfd.access $OUT/serve.log > /tmp/s && cp /tmp/s $OUT/serve.log
tfd bench --shape qwen3_5-35b-a3b --streams 32 --prompt 1024 --new 256 --temperature 0 --out $OUT/engine 2>&1 | tail -1; echo "t=$(el)"

#!/usr/bin/env bash
# The 8-minute soak at the final tree (Triton cache carried from the call before), then one stream.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
python -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1 || { echo pip fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
mkdir -p /tmp/tc && tar xzf .dev/triton.tgz -C /tmp/tc
R=$OUT/r; mkdir -p $R
cd /tmp
export TRITON_CACHE_DIR=/tmp/tc/triton TF_ADMIN_SOCKET=/tmp/tfd-admin.sock
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv > $R/gpu.txt
start=$(date +%s)
tfd serve --shape qwen3_5-9b > $R/serve.log 2>&1 &
pid=$!
until python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null; do
  sleep 1; kill -0 $pid 2>/dev/null || { echo "server died"; tail -50 $R/serve.log; exit 1; }
  [ $(( $(date +%s) - start )) -gt 200 ] && { echo "no READY"; tail -30 $R/serve.log; kill $pid; exit 1; }
done
echo "READY after $(( $(date +%s) - start )) s at t=$(el)" | tee $R/ready.txt
soak=$(( 555 - $(el) )); [ $soak -gt 480 ] && soak=480
echo "soak for $soak s"
tfd conformance --url http://127.0.0.1:8000 --admin /tmp/tfd-admin.sock --soak $soak --clients 64 --flat 2 \
  --json $R/soak.json > $R/soak.txt 2>&1
echo "soak rc=$?" | tee -a $R/soak.txt
tail -25 $R/soak.txt
tfd admin --socket /tmp/tfd-admin.sock learn > $R/learn.json 2>&1; head -c 300 $R/learn.json; echo
tfd bench --serve http://127.0.0.1:8000 --prompt 1024 --new 256 --no-drafts --concurrency 1 --requests 4 --out $R/one > $R/one.txt 2>&1; tail -2 $R/one.txt
kill -TERM $pid; wait $pid; echo "serve rc=$? t=$(el)"
grep -v tfd.access $R/serve.log > $R/f && mv $R/f $R/serve.log
grep -n 'compiled while serving\|warm-up (\|planned' $R/serve.log | cut -c1-250 | head -8
[ $(el) -lt 540 ] && timeout $(( 585 - $(el) )) tfd bench --shape qwen3_5-9b --streams 1 --prompt 1024 --new 256 --temperature 0 --out $R/engine1 > $R/engine1.txt 2>&1; tail -2 $R/engine1.txt
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R; echo "t=$(el)"

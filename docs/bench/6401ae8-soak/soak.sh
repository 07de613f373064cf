#!/usr/bin/env bash
# The 8-minute soak with --flat 2 against the 9B-shape daemon, started as a user starts it.
set -u
START_ALL=$(date +%s)
python -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1 || { cat $OUT/pip.log; exit 1; }
export PYTHONPATH=/tmp/site
export PATH=/tmp/site/bin:$PATH
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv > $OUT/gpu.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/gpu.txt
python -c "import tfd.cli, tfd.server.daemon, tfd.conformance.soak, tokenizers, safetensors, jinja2, httpx, hypercorn, starlette, prometheus_client, trio" || { echo "imports fail"; exit 1; }
head -1 /tmp/site/bin/tfd; /tmp/site/bin/tfd --version || exit 1
cd /tmp
export TRITON_CACHE_DIR=/tmp/triton TF_ADMIN_SOCKET=/tmp/tfd-admin.sock
start=$(date +%s)
tfd serve --shape qwen3_5-9b > $OUT/serve.log 2>&1 &
pid=$!
until python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null; do
  sleep 1
  kill -0 $pid 2>/dev/null || { echo "server died"; tail -50 $OUT/serve.log; exit 1; }
  [ $(( $(date +%s) - start )) -gt 200 ] && { echo "no READY in 200 s"; tail -30 $OUT/serve.log; kill $pid; exit 1; }
done
echo "READY after $(( $(date +%s) - start )) s" | tee $OUT/ready.txt
t0=$START_ALL
soak=$(( 575 - ($(date +%s) - t0) )); [ $soak -gt 480 ] && soak=480
echo "soak for $soak s"
tfd conformance --url http://127.0.0.1:8000 --admin /tmp/tfd-admin.sock --soak $soak --clients 64 --flat 2 \
  --json $OUT/soak.json > $OUT/soak.txt 2>&1
echo "soak rc=$?" | tee -a $OUT/soak.txt
cat $OUT/soak.txt
tfd admin --socket /tmp/tfd-admin.sock learn > $OUT/learn.json 2>&1; head -c 600 $OUT/learn.json; echo
kill -TERM $pid; wait $pid; echo "serve rc=$?"
grep -n 'compiled while serving\|warm-up\|variants' $OUT/serve.log | head -20

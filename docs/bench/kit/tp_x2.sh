#!/usr/bin/env bash
# Issue 35's acceptance on nvidia-h200-x2 (or larger): Qwen3-Next-80B-A3B in bf16, all 48 layers, at N = 2:
# tfd bench --tensor-parallel 2 at 1 and 32 streams (its sums timed alone, the roofline without them), then
# tfd serve --shape ... --tensor-parallel 2 and conformance's full profile against it. Carry .whl .dev.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh > /dev/null 2>&1 || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
nvidia-smi topo -m > $R/topo.txt 2>&1
TF_SHAPE=qwen3_next-80b-a3b timeout 280 tfd bench --tensor-parallel 2 --streams 1,32 --prompt 1024 --new 256 \
  --out $R/80b-tp2 > $R/80b-tp2.txt 2>&1
echo "bench rc=$? t=$(el)"; grep -a "tok/s\|rror\|cut" $R/80b-tp2.txt | cut -c1-300
cd /tmp
TF_SHAPE=qwen3_next-80b-a3b TF_TENSOR_PARALLEL=2 TF_ADMIN_SOCKET=/tmp/tfd-admin.sock tfd serve > $R/serve.log 2>&1 &
pid=$!
until python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null; do
  sleep 2; kill -0 $pid 2>/dev/null || { echo "server died"; tail -20 $R/serve.log; break; }
done
echo "READY t=$(el)"
timeout $(( 560 - $(el) )) tfd conformance --url http://127.0.0.1:8000 --admin /tmp/tfd-admin.sock --profile full \
  --json $R/conformance.json > $R/conformance.txt 2>&1; echo "conformance rc=$?"; tail -10 $R/conformance.txt
kill -TERM $pid; wait $pid; grep -av tfd.access $R/serve.log > $R/s && mv $R/s $R/serve.log
cd $OUT && tar czf r.tgz r && rm -rf r

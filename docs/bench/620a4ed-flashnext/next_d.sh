#!/usr/bin/env bash
# Next session, call D: tfd conformance --profile full against the Flash Next demo on the H200, its
# prompts led past the demo's sparse attention budget of 64 (issue 31's acceptance). Carry .whl .dev.
set -u
T0=$(date +%s)
bash .dev/install.sh || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
mkdir -p $OUT/r; cd /tmp
TF_DEMO=flashnext TF_ADMIN_SOCKET=/tmp/tfd-admin.sock tfd serve > $OUT/r/serve.log 2>&1 &
pid=$!
until python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null; do
  sleep 1; kill -0 $pid 2>/dev/null || { echo "server died"; tail -20 $OUT/r/serve.log; exit 1; }
done
echo "READY t=$(( $(date +%s) - T0 ))"
timeout 400 tfd conformance --url http://127.0.0.1:8000 --admin /tmp/tfd-admin.sock --profile full \
  --json $OUT/r/conformance.json 2>&1 | tee $OUT/r/conformance.txt
kill -TERM $pid; wait $pid; grep -v tfd.access $OUT/r/serve.log > $OUT/r/s && mv $OUT/r/s $OUT/r/serve.log
echo "t=$(( $(date +%s) - T0 ))"

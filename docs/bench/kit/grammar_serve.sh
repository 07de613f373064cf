#!/usr/bin/env bash
# The demo daemon on the H200 after issue 33's grammar changes: its full warm-up (the masked draw's
# variants before READY), conformance's quick profile (json rows among its samplings), and whether
# anything compiled while serving. Carry .whl .dev.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh > /dev/null 2>&1 || { echo install fails; exit 1; }
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R; cd /tmp
TF_ADMIN_SOCKET=/tmp/a.sock tfd serve > $R/serve.log 2>&1 &
pid=$!
until python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)" \
    2>/dev/null; do sleep 1; kill -0 $pid 2>/dev/null || { echo "server died"; break; }; done
echo "READY t=$(el)"
timeout 100 tfd conformance --url http://127.0.0.1:8000 --admin /tmp/a.sock --profile quick --json $R/quick.json \
  > $R/quick.txt 2>&1; echo "conformance rc=$? t=$(el)"; tail -9 $R/quick.txt
kill -TERM $pid; wait $pid; grep -av tfd.access $R/serve.log > $R/s && mv $R/s $R/serve.log
grep -a "warm-up\|compiled while serving" $R/serve.log | cut -c1-300
cd $OUT && tar czf r.tgz r && rm -rf r

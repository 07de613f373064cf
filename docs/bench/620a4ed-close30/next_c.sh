#!/usr/bin/env bash
# Next session, call C: the 35B-A3B's 128-replaced and one-stream runs against its engine (issue 30),
# then Flash Next at a 32,768-token prompt against 1,024 and its one-stream step profiled (issue 31).
# Carry .whl .dev.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
cd /tmp
TF_ADMIN_SOCKET=/tmp/tfd-admin.sock tfd serve --shape qwen3_5-35b-a3b > $R/serve.log 2>&1 &
pid=$!
until python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null; do
  sleep 1; kill -0 $pid 2>/dev/null || { echo "server died"; tail -20 $R/serve.log; break; }
done
echo "READY t=$(el)"
s="--serve http://127.0.0.1:8000 --prompt 1024 --new 256 --no-drafts"
tfd bench $s --concurrency 32 --requests 128 --out $R/replaced 2>&1 | tail -1
tfd bench $s --concurrency 1 --requests 4 --out $R/one 2>&1 | tail -1
kill -TERM $pid; wait $pid; grep -v tfd.access $R/serve.log > $R/s && mv $R/s $R/serve.log; echo "t=$(el)"
tfd bench --shape qwen3_5-35b-a3b --streams 1,32 --prompt 1024 --new 256 --temperature 0 --out $R/engine 2>&1 | grep x
echo "t=$(el)"
[ $(el) -lt 330 ] && timeout 150 tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 32768 --new 256 --out $R/long 2>&1 | grep "x1\|rror"
echo "t=$(el)"
[ $(el) -lt 450 ] && timeout 120 tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 64 --profile --out $R/profile 2>&1 | grep "x1\|rror"
cd - > /dev/null; tar czf $OUT/results.tgz -C $OUT r; echo "t=$(el)"

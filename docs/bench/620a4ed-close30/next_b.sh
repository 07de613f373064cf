#!/usr/bin/env bash
# Next session, call B (right after A): the 8-minute soak, --soak 480 --clients 64 --flat 2, against
# the daemon A left running; where it did not outlive A, start one here (then the soak is shorter).
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
kill -0 $(cat /tmp/probe.pid 2>/dev/null) 2>/dev/null && echo "the probe outlived call A" || echo "no probe"
R=$OUT/r; mkdir -p $R
pgrep -of "tfd serve" > /tmp/serve.pid && echo "daemon from A: $(cat /tmp/serve.pid)"
if ! kill -0 $(cat /tmp/serve.pid 2>/dev/null) 2>/dev/null; then
  bash .dev/install.sh
  cd /tmp && TF_ADMIN_SOCKET=/tmp/tfd-admin.sock setsid nohup tfd serve --shape qwen3_5-9b > /tmp/serve.log 2>&1 &
  echo $! > /tmp/serve.pid; cd - > /dev/null; echo "started here"
fi
until python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null; do
  sleep 1; kill -0 $(cat /tmp/serve.pid) 2>/dev/null || { echo "server died"; tail -30 /tmp/serve.log; exit 1; }
done
echo "READY at t=$(el)"
soak=$(( 580 - $(el) )); [ $soak -gt 480 ] && soak=480
tfd conformance --url http://127.0.0.1:8000 --admin /tmp/tfd-admin.sock --soak $soak --clients 64 --flat 2 \
  --json $R/soak.json > $R/soak.txt 2>&1; echo "soak $soak s rc=$?"; tail -12 $R/soak.txt
kill -TERM $(cat /tmp/serve.pid); sleep 3
grep -v tfd.access /tmp/serve.log > $R/serve.log; grep -n 'compiled while serving\|warm-up (\|planned' $R/serve.log | cut -c1-200
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R; echo "t=$(el)"

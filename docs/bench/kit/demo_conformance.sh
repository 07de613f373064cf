#!/usr/bin/env bash
# A demo daemon started from /tmp as a user starts it (TF_DEMO=$1; "" for the default demo), conformance's
# profile $2 against it, then the daemon stopped (SIGTERM): its log without access lines and the report in
# $OUT/r as $3-serve.log, $3-conformance.{txt,json}; printed: READY, the report's gates, the warm-up's lines and
# whatever compiled while serving. Needs install.sh's /tmp/site; the callers install and pack $OUT/r.
set -u
demo=$1 profile=$2 name=$3
T0=$(date +%s)
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R; LOG=$R/$name-serve.log
cd /tmp
env ${demo:+TF_DEMO=$demo} TF_ADMIN_SOCKET=/tmp/tfd-admin.sock timeout 400 tfd serve > $LOG 2>&1 &
pid=$!
until python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)" \
    2>/dev/null; do
  sleep 1; kill -0 $pid 2>/dev/null || { echo "$name: server died"; tail -20 $LOG; exit 1; }
done
echo "$name READY t=$(( $(date +%s) - T0 ))"
timeout 150 tfd conformance --url http://127.0.0.1:8000 --admin /tmp/tfd-admin.sock --profile $profile \
  --json $R/$name-conformance.json > $R/$name-conformance.txt 2>&1; echo "$name conformance rc=$?"
tail -10 $R/$name-conformance.txt
kill -TERM $pid; wait $pid; grep -av tfd.access $LOG > $R/s && mv $R/s $LOG
grep -a "warm-up\|compiled while serving" $LOG | cut -c1-300

#!/usr/bin/env bash
# The next session's first device call: did the warm-up's fixes (152b8fd: the draw's per-row fields and
# prefill's strides unspecialized, prompts of every sorted block count with an indexer) leave nothing to
# compile while serving? The demo daemon (grammar_serve.sh: its quick conformance) and the Flash Next demo
# (conformance's full profile); then issue 35 on one card (tp_one_card.sh, its bound now one rank's bf16
# error against fp32). Carry .whl .whl-test .dev .devcache-tp.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
timeout 150 bash .dev/grammar_serve.sh; echo "grammar_serve t=$(el)"
[ -f $OUT/r.tgz ] && mv $OUT/r.tgz $OUT/demo.tgz
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R; ROOT=$PWD
cd /tmp
TF_DEMO=flashnext TF_ADMIN_SOCKET=/tmp/tfd-admin.sock timeout 240 tfd serve > $R/serve-fn.log 2>&1 &
pid=$!
until python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null; do
  sleep 1; kill -0 $pid 2>/dev/null || { echo "server died"; tail -20 $R/serve-fn.log; break; }
done
echo "Flash Next READY t=$(el)"
timeout 150 tfd conformance --url http://127.0.0.1:8000 --admin /tmp/tfd-admin.sock --profile full \
  --json $R/conformance-fn.json > $R/conformance-fn.txt 2>&1; echo "conformance rc=$?"; tail -3 $R/conformance-fn.txt
kill -TERM $pid; wait $pid; grep -av tfd.access $R/serve-fn.log > $R/s && mv $R/s $R/serve-fn.log
grep -a "warm-up\|compiled while" $R/serve-fn.log | cut -c1-300; echo "t=$(el)"
cd $ROOT
LIMIT=$(( 560 - $(el) )) bash .dev/tp_one_card.sh 2>&1 | tail -8 | cut -c1-300; echo "tp t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

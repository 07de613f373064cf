#!/usr/bin/env bash
# Next session, call B (issue 31): tfd conformance --profile full against the Flash Next demo (its prompts
# led past the sparse-attention budget) and against the default demo, each a daemon started through the
# console script from /tmp: the contract on the GPU after this session's kernels (index_pool, block_choice's
# long rows and span choice, ple_rows, write_norm/read_after, mix), and nothing compiled while serving.
# Carry .whl .dev.
set -u
T0=$(date +%s)
bash .dev/install.sh || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
mkdir -p $OUT/r; cd /tmp
for demo in flashnext qwen3_5; do
  TF_DEMO=$demo TF_ADMIN_SOCKET=/tmp/tfd-admin.sock tfd serve > $OUT/r/serve-$demo.log 2>&1 &
  pid=$!
  until python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v1/models', timeout=2)" 2>/dev/null; do
    sleep 1; kill -0 $pid 2>/dev/null || { echo "$demo server died"; tail -20 $OUT/r/serve-$demo.log; break; }
  done
  echo "$demo READY t=$(( $(date +%s) - T0 ))"
  timeout 200 tfd conformance --url http://127.0.0.1:8000 --admin /tmp/tfd-admin.sock --profile full \
    --json $OUT/r/conformance-$demo.json > $OUT/r/conformance-$demo.txt 2>&1; echo "rc=$?"; tail -9 $OUT/r/conformance-$demo.txt
  kill -TERM $pid; wait $pid
  grep -a "warm-up (\|compiled while" $OUT/r/serve-$demo.log | cut -c1-200
  grep -av tfd.access $OUT/r/serve-$demo.log > $OUT/r/s && mv $OUT/r/s $OUT/r/serve-$demo.log
done
echo "t=$(( $(date +%s) - T0 ))"

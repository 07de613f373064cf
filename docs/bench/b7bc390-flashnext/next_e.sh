#!/usr/bin/env bash
# Call E: the GPU kernel tests the grouped norm and the unspecialized counts touch, Flash Next at one
# stream, then the Flash Next demo through conformance's full profile: does anything compile while serving?
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh .whl-test || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
TMPDIR=$PWD/.devcache timeout 100 python -m pytest -q -m gpu -n 8 -p no:cacheprovider -p no:benchmark \
  -W ignore::DeprecationWarning tests/kernels/test_norm.py tests/kernels/test_gemm.py tests/kernels/test_block_scores.py \
  tests/kernels/test_hyper.py > $R/gpu-tests.txt 2>&1; echo "gpu tests rc=$? t=$(el)"; tail -3 $R/gpu-tests.txt | cut -c1-200
timeout 90 tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 256 --out $R/fn > $R/fn.txt 2>&1
echo "fn rc=$? t=$(el)"; grep "qwen3_8" $R/fn.txt | cut -c1-300
cd /tmp
TF_DEMO=flashnext TF_ADMIN_SOCKET=/tmp/tfd-admin.sock tfd serve > $R/serve.log 2>&1 &
pid=$!
until python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null; do
  sleep 1; kill -0 $pid 2>/dev/null || { echo "server died"; tail -20 $R/serve.log; break; }
done
echo "READY t=$(el)"
timeout 150 tfd conformance --url http://127.0.0.1:8000 --admin /tmp/tfd-admin.sock --profile full \
  --json $R/conformance.json > $R/conformance.txt 2>&1; echo "conformance rc=$?"; tail -3 $R/conformance.txt
kill -TERM $pid; wait $pid; grep -av tfd.access $R/serve.log > $R/s && mv $R/s $R/serve.log
grep -a "warm-up\|compiled while" $R/serve.log | cut -c1-200; echo "t=$(el)"

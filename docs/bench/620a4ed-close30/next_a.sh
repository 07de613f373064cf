#!/usr/bin/env bash
# Next session, call A: the -m gpu tests, Flash Next at 1, 8 and 32 streams (issue 31), then the 9B
# daemon started in the background for call B's soak (and a probe: do processes outlive a call?).
# Carry .whl .whl-test .devcache .dev .dev31.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh .whl-test || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
setsid nohup sleep 1500 > /dev/null 2>&1 & echo $! > /tmp/probe.pid
TMPDIR=$PWD/.devcache timeout 240 python -m pytest -q -m gpu -n 8 -p no:cacheprovider -W ignore::DeprecationWarning \
  tests/kernels tests/engine/test_device_path.py tests/engine/test_drafting.py tests/model/test_verify.py \
  tests/model/test_ops.py tests/store > $R/gpu-tests.txt 2>&1; echo "gpu tests rc=$? t=$(el)"; tail -15 $R/gpu-tests.txt | cut -c1-250
timeout 200 tfd bench --shape qwen3_8-flash-next --streams 1,8,32 --prompt 1024 --new 256 --out $R/fn > $R/fn.txt 2>&1
echo "fn rc=$? t=$(el)"; grep "qwen3_8" $R/fn.txt | cut -c1-300
cd /tmp && TRITON_CACHE_DIR=/tmp/triton TF_ADMIN_SOCKET=/tmp/tfd-admin.sock setsid nohup tfd serve --shape qwen3_5-9b > /tmp/serve.log 2>&1 &
echo $! > /tmp/serve.pid; echo "serve started t=$(el)"
cd - > /dev/null; tar czf $OUT/results.tgz -C $OUT r && rm -rf $R

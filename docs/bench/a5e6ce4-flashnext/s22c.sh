#!/usr/bin/env bash
# Session 22, call C (issue 31): conformance's full profile against the Flash Next demo (prompts past its
# sparse-attention budget; nothing compiled while serving?), the model-level GPU tests not reached in call B
# (named one by one), then the MoE's prompt tiles tried wider at 35B-A3B 8 x 1,024 prefill (variants).
# Carry .whl .whl-test .devcache .dev.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh .whl-test || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R; ROOT=$PWD
cd /tmp
TF_DEMO=flashnext TF_ADMIN_SOCKET=/tmp/tfd-admin.sock tfd serve > $R/serve.log 2>&1 &
pid=$!
until python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null; do
  sleep 1; kill -0 $pid 2>/dev/null || { echo "server died"; tail -20 $R/serve.log; break; }
done
echo "READY t=$(el)"
timeout 150 tfd conformance --url http://127.0.0.1:8000 --admin /tmp/tfd-admin.sock --profile full \
  --json $R/conformance.json > $R/conformance.txt 2>&1; echo "conformance rc=$?"; tail -10 $R/conformance.txt
kill -TERM $pid; wait $pid; grep -av tfd.access $R/serve.log > $R/s && mv $R/s $R/serve.log
grep -a "warm-up\|compiled while" $R/serve.log | cut -c1-200; echo "t=$(el)"
cd $ROOT
left=$(( 330 - $(el) )); [ $left -lt 60 ] && left=60
TMPDIR=$PWD/.devcache timeout $left python -m pytest -v -m gpu -n 8 -p no:cacheprovider -p no:benchmark \
  -W ignore::DeprecationWarning -rfE tests/families/test_flash_next_variants.py tests/families/test_parity.py \
  tests/model/test_qsa.py tests/model/test_ple.py tests/kernels/test_moe.py::test_gpu_a_prompts_tiles_give_a_row_the_bits_of_decodes \
  tests/engine/test_device_path.py tests/engine/test_drafting.py > $R/gpu-model.txt 2>&1
echo "gpu model tests rc=$? t=$(el)"; grep -a "PASSED\|FAILED\|ERROR" $R/gpu-model.txt | grep -ac PASSED
grep -a "FAILED\|ERROR\|passed\|failed" $R/gpu-model.txt | cut -c1-220 | head -20
V="--variant m64= --variant m128=tfd_kernels.moe.PROMPT_M=128 --variant n128=tfd_kernels.moe.PROMPT_GATE_N=128,tfd_kernels.moe.PROMPT_STAGES=2 --variant w4=tfd_kernels.moe.PROMPT_WARPS=4"
[ $(el) -lt 335 ] && timeout 95 tfd bench --shape qwen3_5-35b-a3b --streams 8 --prompt 1024 --new 8 --rounds 1 $V --out $R/var 2>&1 \
  | grep -a "best of\|rror" | cut -c1-300
echo "t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

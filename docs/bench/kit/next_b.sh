#!/usr/bin/env bash
# Next session, call B (issue 31): the MoE's prompt tiles swept at 8 x 1,024 prefill (tfd bench --variant, one
# process a shape, tokens compared): the down launch ran at 158 TFLOP/s and the gate-up at 274 in the
# 35B-A3B's prefill (the whole-form GEMM at 593). Then conformance's full profile against the Flash Next demo:
# nothing compiled while serving after 8fb50c7? Carry .whl .dev.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh || { echo install fails; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
M=tfd_kernels.moe
V="--variant base= --variant down256=$M.PROMPT_DOWN_N=256,$M.PROMPT_DOWN_STAGES=2 --variant gate4=$M.PROMPT_GATE_STAGES=4
   --variant down64=$M.PROMPT_DOWN_N=64,$M.PROMPT_DOWN_STAGES=4 --variant m128=$M.PROMPT_M=128,$M.PROMPT_GATE_STAGES=2
   --variant pairs16=$M.PROMPT_PAIRS=16"
for shape in qwen3_5-35b-a3b qwen3_8-flash-next; do
  [ $(el) -lt 260 ] && timeout 110 tfd bench --shape $shape --streams 8 --prompt 1024 --new 8 --rounds 2 $V --out $R/var 2>&1 \
    | grep -a "best of\|rror" | cut -c1-300
  echo "t=$(el)"
done
# the mix's K step at one stream's decode (7.2 us a launch, 34 a step; its weights' copy floor 1.4 us)
H=tfd_kernels.hyper
timeout 100 tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 64 --rounds 3 --variant k64= \
  --variant k128=$H.MIX_K=128 --variant k32=$H.MIX_K=32 --out $R/var 2>&1 | grep -a "best of\|rror" | cut -c1-300
echo "t=$(el)"
[ $(el) -gt 330 ] && { echo "no time left for conformance (t=$(el))"; cd $OUT && tar czf r.tgz r && rm -rf r; exit 0; }
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
cd $OUT && tar czf r.tgz r && rm -rf r

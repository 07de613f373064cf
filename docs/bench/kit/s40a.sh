#!/usr/bin/env bash
# Fortieth session's first call, useful on either card. On an H200: s39a.sh (the ring's GPU tests and the
# device path, issue 31's acceptance runs). On an H100: the same GPU tests, then issue 34's A/B of the FP8
# few-row tile 32 columns wide with TARGET 128 against the defaults (9B FP8, one stream, two rounds
# interleaved, tokens compared; and fp8_gemm.BALANCED's whole waves of programs), fp8_stages.py, and the 35B-A3B prefill's idle time. ~560 s.
# Carry .whl .whl-test .dev .devcache.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash .dev/s39a.sh; fi
. .dev/start.sh
gpu_tests 100 4 tests/pool/test_staging.py tests/engine/test_device_path.py -k "not wide and not two-streams"
timeout $(( 330 - $(el) )) tfd bench --shape qwen3_5-9b --dtype fp8 --streams 1 --prompt 1024 --new 128 --rounds 2 \
  --variant base= --variant n32=tfd_kernels.fp8_gemm.SPREAD_N=32,tfd_kernels.fp8_gemm.TARGET=128 \
  --variant bal=tfd_kernels.fp8_gemm.BALANCED=1 \
  --out $R/9b-fp8-n32 > $R/9b-fp8-n32.txt 2>&1; echo "n32 rc=$? t=$(el)"; grep -a "variant\|x1:\|rror" $R/9b-fp8-n32.txt | cut -c1-300
timeout $(( 420 - $(el) )) python .dev/fp8_stages.py 2>&1 | grep -v "arn" | tee $R/fp8-stages.txt | cut -c1-400
echo "stages t=$(el)"
[ $(el) -lt 450 ] && prefill_idle
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Forty-seventh session's last device time (~420 s, any card): s49a.sh in less time. On an H200 issue 31's bars
# at HEAD (Flash Next --streams 1,8,32 --new 256, the MoE shapes' 8 x 1,024 prefill), then 32,768 against 1,024
# if time is left; elsewhere the review's GPU tests and the device path's MoE families. Carry .whl .whl-test .devk
# .devcache.
. .dev/start.sh
case "$CARD" in
*H200*)
  timeout 130 tfd bench --shape qwen3_8-flash-next --streams 1,8,32 --prompt 1024 --new 256 --out $R/fn \
    > $R/fn.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/fn.txt | cut -c1-300
  for s in qwen3_5-35b-a3b qwen3_next-80b-a3b; do
    timeout 75 tfd bench --shape $s --streams 8 --prompt 1024 --new 8 --rounds 2 --out $R/$s > $R/$s.txt 2>&1
    echo "$s rc=$? t=$(el)"; grep -a "prefill\|rror" $R/$s.txt | cut -c1-300
  done
  for p in 32768 1024; do
    [ $(el) -lt 330 ] || break
    timeout $(( 410 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt $p --new 64 --out $R/long \
      > $R/long-$p.txt 2>&1; echo "long $p rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/long-$p.txt | cut -c1-300
  done ;;
*)
  gpu_tests 130 4 -rE tests/kernels/test_moe_fp8_gpu.py tests/kernels/test_hyper_mix.py tests/kernels/test_moe_block.py \
    tests/kernels/test_moe_gpu.py
  grep -a "^ERROR\|^FAILED\|^E  " $R/gpu-tests.txt | cut -c1-200 | head -8; mv $R/gpu-tests.txt $R/gpu-tests-kernels.txt
  gpu_tests $(( 400 - $(el) )) 2 -rE tests/engine/test_device_path.py -k "qwen3_5_moe or qwen4_exp or qwen3_next"
  grep -a "^ERROR\|^FAILED\|^E  " $R/gpu-tests.txt | cut -c1-200 | head -8 ;;
esac
cd $OUT && tar czf r.tgz r && rm -rf r

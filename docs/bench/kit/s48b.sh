#!/usr/bin/env bash
# Forty-sixth session, second call (~450 s, any card): the GPU tests of what call 1 made default or fixed (the
# MoE's terms in the model dtype: the exact-terms test, every MoE kernel GPU test, FP8 included; the prompt mix
# apart at 64 columns), the device path's MoE families end to end; then issue 31's benches at HEAD (Flash Next
# x1 and x32 at --new 256 with the n-gram table out of the roofline, the MoE shapes' 8 x 1,024 prefill), and on
# an H200 the 32k against 1k decode too. Carry .whl .whl-test .devk .devcache.
. .dev/start.sh
gpu_tests 100 4 -rE tests/kernels/test_moe_gpu.py tests/kernels/test_moe_fp8_gpu.py tests/kernels/test_moe_block.py \
  tests/kernels/test_hyper_mix.py
grep -a "^ERROR\|^FAILED\|^E  " $R/gpu-tests.txt | cut -c1-200 | head -8
mv $R/gpu-tests.txt $R/gpu-tests-kernels.txt
gpu_tests 150 2 -rE tests/engine/test_device_path.py -k "qwen3_5_moe or qwen4_exp"
grep -a "^ERROR\|^FAILED\|^E  " $R/gpu-tests.txt | cut -c1-200 | head -8
timeout 90 tfd bench --shape qwen3_8-flash-next --streams 1,32 --prompt 1024 --new 256 --out $R/fn \
  > $R/fn.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/fn.txt | cut -c1-300
for s in qwen3_5-35b-a3b qwen3_next-80b-a3b; do
  [ $(el) -lt 480 ] || break
  timeout 80 tfd bench --shape $s --streams 8 --prompt 1024 --new 8 --rounds 2 --out $R/$s > $R/$s.txt 2>&1
  echo "$s rc=$? t=$(el)"; grep -a "prefill\|rror" $R/$s.txt | cut -c1-300
done
case "$CARD" in *H200*)
  for p in 32768 1024; do
    [ $(el) -lt 500 ] || break
    timeout $(( 580 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt $p --new 64 --out $R/long \
      > $R/long-$p.txt 2>&1; echo "long $p rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/long-$p.txt | cut -c1-300
  done ;;
esac
cd $OUT && tar czf r.tgz r && rm -rf r

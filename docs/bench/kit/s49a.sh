#!/usr/bin/env bash
# Forty-seventh session's first call (~580 s, any card). On an H200: issue 31's bars at HEAD (Flash Next
# --streams 1,8,32 --new 256 as the acceptance states it, the MoE shapes' 8 x 1,024 prefill), then one stream at
# 32,768 against 1,024, then the review's GPU tests. On any other card: the review's GPU tests (FP8 MoE with the
# bf16 buffer of terms, both prompt mix forms, the block from its input), the device path's MoE families, then
# the Flash Next demo's full conformance (warm-up compiles the new variants before READY). Carry .whl .whl-test
# .devk .devcache.
. .dev/start.sh
review() {
  gpu_tests $1 4 -rE tests/kernels/test_moe_fp8_gpu.py tests/kernels/test_hyper_mix.py tests/kernels/test_moe_block.py \
    tests/kernels/test_moe_gpu.py
  grep -a "^ERROR\|^FAILED\|^E  " $R/gpu-tests.txt | cut -c1-200 | head -8; mv $R/gpu-tests.txt $R/gpu-tests-kernels.txt
}
case "$CARD" in
*H200*)
  timeout 130 tfd bench --shape qwen3_8-flash-next --streams 1,8,32 --prompt 1024 --new 256 --out $R/fn \
    > $R/fn.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/fn.txt | cut -c1-300
  for s in qwen3_5-35b-a3b qwen3_next-80b-a3b; do
    timeout 80 tfd bench --shape $s --streams 8 --prompt 1024 --new 8 --rounds 2 --out $R/$s > $R/$s.txt 2>&1
    echo "$s rc=$? t=$(el)"; grep -a "prefill\|rror" $R/$s.txt | cut -c1-300
  done
  for p in 32768 1024; do
    [ $(el) -lt 420 ] || break
    timeout $(( 470 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt $p --new 64 --out $R/long \
      > $R/long-$p.txt 2>&1; echo "long $p rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/long-$p.txt | cut -c1-300
  done
  [ $(el) -lt 470 ] && review $(( 575 - $(el) )) ;;
*)
  review 120
  gpu_tests 150 2 -rE tests/engine/test_device_path.py -k "qwen3_5_moe or qwen4_exp or qwen3_next"
  grep -a "^ERROR\|^FAILED\|^E  " $R/gpu-tests.txt | cut -c1-200 | head -8
  [ $(el) -lt 330 ] && bash .dev/demo_conformance.sh flashnext full flashnext; echo "conformance t=$(el)" ;;
esac
cd $OUT && tar czf r.tgz r && rm -rf r

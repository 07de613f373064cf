#!/usr/bin/env bash
# Forty-seventh session's last device time (~200 s, any card). On an H200 issue 31's one- and 32-stream Flash Next
# bars at HEAD (--new 256), then the 35B-A3B's 8 x 1,024 prefill; elsewhere the review's kernel GPU tests (the FP8
# MoE with the bf16 terms, both prompt mix forms, the block from its input). Carry .whl .whl-test .devk .devcache.
. .dev/start.sh
case "$CARD" in
*H200*)
  timeout 90 tfd bench --shape qwen3_8-flash-next --streams 1,32 --prompt 1024 --new 256 --out $R/fn \
    > $R/fn.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/fn.txt | cut -c1-300
  timeout $(( 200 - $(el) )) tfd bench --shape qwen3_5-35b-a3b --streams 8 --prompt 1024 --new 8 \
    --out $R/qwen3_5-35b-a3b > $R/35b.txt 2>&1; echo "35b rc=$? t=$(el)"; grep -a "prefill\|rror" $R/35b.txt | cut -c1-300 ;;
*)
  gpu_tests 150 4 -rE tests/kernels/test_moe_fp8_gpu.py tests/kernels/test_hyper_mix.py tests/kernels/test_moe_block.py
  grep -a "^ERROR\|^FAILED\|^E  " $R/gpu-tests.txt | cut -c1-200 | head -8 ;;
esac
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Forty-sixth session, last call (~300 s, any card): s48b.sh cut to fit what device time is left. The GPU tests of
# what this session changed (the MoE's terms rounded: the exact-terms test; Flash Next's block from its input with
# the router's product in the one launch; the prompt mix apart at 64 columns), the device path's Flash Next GPU
# tests, then Flash Next x1 and x32 at --new 256 and the 35B-A3B's 8 x 1,024 prefill at HEAD.
# Carry .whl .whl-test .devk .devcache.
. .dev/start.sh
gpu_tests 80 4 -rE tests/kernels/test_moe_gpu.py tests/kernels/test_moe_block.py tests/kernels/test_hyper_mix.py \
  -k "rounded or flash_next or apart"
grep -a "^ERROR\|^FAILED\|^E  " $R/gpu-tests.txt | cut -c1-200 | head -8
mv $R/gpu-tests.txt $R/gpu-tests-kernels.txt
gpu_tests 100 2 -rE tests/engine/test_device_path.py -k "qwen4_exp"
grep -a "^ERROR\|^FAILED\|^E  " $R/gpu-tests.txt | cut -c1-200 | head -8
timeout 90 tfd bench --shape qwen3_8-flash-next --streams 1,32 --prompt 1024 --new 256 --out $R/fn \
  > $R/fn.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/fn.txt | cut -c1-300
[ $(el) -lt 330 ] && timeout 70 tfd bench --shape qwen3_5-35b-a3b --streams 8 --prompt 1024 --new 8 --rounds 2 \
  --out $R/35b > $R/35b.txt 2>&1; echo "35b rc=$? t=$(el)"; grep -a "prefill\|rror" $R/35b.txt | cut -c1-300
cd $OUT && tar czf r.tgz r && rm -rf r

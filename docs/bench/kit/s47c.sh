#!/usr/bin/env bash
# For the forty-fifth session, any card (~560 s): Flash Next's 1 x 1,024 prefill (17.5% of the matmul rate on the
# H200, bar 25%) with its two 83-us prompt launches changed, the same bits: the hyper down rows' product in the
# narrow whole tile (gemm_plan.NARROW_WHOLE_PROGRAMS: 96 programs of 64 x 64 for the 24 of 128 x 128; 200 also
# narrows the 160-program products) and the prompt mix as its three launches (hyper.MIX_PROMPT_SPLIT). First
# their GPU bits tests, then the bench's variants (tokens compared), then the 35B-A3B's 8 x 1,024 with the
# narrow tile at 200 (its router's whole form runs 128 programs there); last, the device path's GPU tests of Flash
# Next's wide and two-stream checkpoints with DENSE_PREFIX on (s47b.sh's errored: the device's transformers
# refuses huggingface-hub 2.4, and .devcache lacked them). Carry .whl .whl-test .devk .devcache.
. .dev/start.sh
gpu_tests 90 4 -rE tests/kernels/test_gemm.py tests/kernels/test_hyper.py -k "narrow or prompt or batch_invariant"
grep -a "^ERROR\|^FAILED\|^E  " $R/gpu-tests.txt | cut -c1-200 | head -8
G=tfd_kernels.gemm_plan.NARROW_WHOLE_PROGRAMS H=tfd_kernels.hyper.MIX_PROMPT_SPLIT
timeout $(( 220 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 8 --rounds 2 \
  --variant base= --variant n100=$G=100 --variant n200=$G=200 --variant split=$H=1 --variant both=$G=100,$H=1 \
  --out $R/fn > $R/fn.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "prefill\|rror\|NOT\|differ" $R/fn.txt | cut -c1-300
timeout $(( 300 - $(el) )) tfd bench --shape qwen3_5-35b-a3b --streams 8 --prompt 1024 --new 8 --rounds 2 \
  --variant base= --variant n200=$G=200 --out $R/35b > $R/35b.txt 2>&1
echo "35b rc=$? t=$(el)"; grep -a "prefill\|rror\|NOT\|differ" $R/35b.txt | cut -c1-300
mv $R/gpu-tests.txt $R/gpu-tests-kernels.txt
export PYTHONPATH=$PYTHONPATH:$PWD/.dev SET=tfd.model.attention.DENSE_PREFIX=1
gpu_tests $(( 585 - $(el) )) 8 -rE -p constants tests/engine/test_device_path.py -k "qwen4_exp"
grep -a "^ERROR\|^FAILED\|^E  " $R/gpu-tests.txt | cut -c1-200 | head -8
cd $OUT && tar czf r.tgz r && rm -rf r

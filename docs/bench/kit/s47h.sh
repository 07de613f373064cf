#!/usr/bin/env bash
# For the next call, any card (~280 s): the prompt mix with each stream's product its own
# accumulator (hyper_mix.MIX_PROMPT_APART: the same bits, no launch added; the one launch took 89 us at 1,024 rows
# on the H100, its three launches 45): its GPU bits tests, hyper_prompt_sweep.py's mixes (SWEEP=mix); then on an
# H200 issue 31's acceptance benches (s47g.sh's first two), on any other card Flash Next's 1 x 1,024 prefill
# with and without it and the prompt pass's host profile (prefill_host.py PASS_ONLY=1: its Triton launches by
# kernel). Carry .whl .whl-test .devk.
. .dev/start.sh
gpu_tests 70 4 -rE tests/kernels/test_hyper_mix.py tests/kernels/test_gemm.py -k "apart or prompt or narrow"
grep -a "^ERROR\|^FAILED\|^E  " $R/gpu-tests.txt | cut -c1-200 | head -6
SWEEP=mix timeout 70 python .dev/hyper_prompt_sweep.py 2>&1 | grep -v "arn" | tee $R/sweep.txt | cut -c1-500
echo "sweep t=$(el)"
case "$CARD" in
*H200*)
  timeout $(( 180 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1,32 --prompt 1024 --new 256 --out $R/fn \
    > $R/fn.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/fn.txt | cut -c1-300
  timeout $(( 245 - $(el) )) tfd bench --shape qwen3_5-35b-a3b --streams 8 --prompt 1024 --new 8 --rounds 2 \
    --out $R/35b > $R/35b.txt 2>&1; echo "35b rc=$? t=$(el)"; grep -a "prefill\|rror" $R/35b.txt | cut -c1-300 ;;
*)
  timeout $(( 210 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 8 --rounds 4 \
    --variant base= --variant apart=tfd_kernels.hyper_mix.MIX_PROMPT_APART=1 --out $R/fn > $R/fn.txt 2>&1
  echo "fn rc=$? t=$(el)"; grep -a "prefill\|rror\|NOT\|differ" $R/fn.txt | cut -c1-300
  PASS_ONLY=1 timeout $(( 270 - $(el) )) python .dev/prefill_host.py qwen3_8-flash-next 1 1024 2>&1 | grep -v "arn" \
    > $R/host-pass.txt; echo "host t=$(el)"; head -3 $R/host-pass.txt | cut -c1-600 ;;
esac
cd $OUT && tar czf r.tgz r && rm -rf r

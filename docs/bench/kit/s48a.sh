#!/usr/bin/env bash
# Forty-sixth session, any card (~340 s): s47h.sh's questions (the prompt mix with each stream's product apart,
# hyper_mix.MIX_PROMPT_APART: its GPU bits tests, its tiles alone, then through the bench; the narrow whole tile's
# test across its default bound), then where Flash Next's 1 x 1,024 prefill goes today (`tfd bench --profile`:
# kernels by launch and the device's idle inside the step; the last such table is 2026-12-06's, before the MoE's
# prompt tiles, the segments, DENSE_PREFIX and the narrow tile). On an H200 the profile gives way to issue 31's
# x1/x32 benches. Carry .whl .whl-test .devk.
. .dev/start.sh
gpu_tests 70 4 -rE tests/kernels/test_hyper_mix.py tests/kernels/test_gemm.py -k "apart or prompt or narrow"
grep -a "^ERROR\|^FAILED\|^E  " $R/gpu-tests.txt | cut -c1-200 | head -6
SWEEP=mix timeout 70 python .dev/hyper_prompt_sweep.py 2>&1 | grep -v "arn" | tee $R/sweep.txt | cut -c1-500
echo "sweep t=$(el)"
timeout $(( 230 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 8 --rounds 4 \
  --variant base= --variant apart=tfd_kernels.hyper_mix.MIX_PROMPT_APART=1 --out $R/fn > $R/fn.txt 2>&1
echo "fn rc=$? t=$(el)"; grep -a "prefill\|rror\|NOT\|differ" $R/fn.txt | cut -c1-300
case "$CARD" in
*H200*)
  timeout $(( 330 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1,32 --prompt 1024 --new 256 \
    --out $R/fn-bars > $R/fn-bars.txt 2>&1; echo "bars rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/fn-bars.txt | cut -c1-300 ;;
*)
  timeout $(( 330 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 8 --profile \
    --out $R/fn-profile > $R/fn-profile.txt 2>&1; echo "profile rc=$? t=$(el)"
  grep -a "prefill\|idle\|rror" $R/fn-profile.txt | head -8 | cut -c1-300 ;;
esac
cd $OUT && tar czf r.tgz r && rm -rf r

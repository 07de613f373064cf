#!/usr/bin/env bash
# Forty-sixth session, any card (~480 s). (1) GPU bits tests: the prompt mix with each stream's product apart
# (hyper_mix.MIX_PROMPT_APART), the narrow whole tile across its default bound, the MoE's weighted terms
# rounded to the model dtype before their sum (moe.TERMS_ROUNDED, d06eec8: the kernels against the reference
# on exact inputs, both settings) and a prompt tile's row with decode's bits. (2) The MoE shapes' 8 x 1,024
# prefill with the terms rounded (the bf16 buffer) against fp32 terms, and Flash Next's 1 x 1,024 prefill with
# the mix apart against the one launch. (3) On an H200 issue 31's acceptance benches (s47g.sh's); on any other
# card where Flash Next's 1 x 1,024 prefill goes today (`tfd bench --profile`) and the mix's tiles alone.
# Carry .whl .whl-test .devk.
. .dev/start.sh
gpu_tests 90 4 -rE tests/kernels/test_hyper_mix.py tests/kernels/test_gemm.py tests/kernels/test_moe_gpu.py \
  -k "apart or prompt or narrow or rounded"
grep -a "^ERROR\|^FAILED\|^E  " $R/gpu-tests.txt | cut -c1-200 | head -6
for s in qwen3_5-35b-a3b qwen3_next-80b-a3b; do
  timeout 130 tfd bench --shape $s --streams 8 --prompt 1024 --new 8 --rounds 3 \
    --variant base= --variant f32=tfd_kernels.moe.TERMS_ROUNDED=0 --out $R/$s-terms > $R/$s-terms.txt 2>&1
  echo "$s rc=$? t=$(el)"; grep -a "prefill\|rror" $R/$s-terms.txt | cut -c1-300
done
timeout 100 tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 8 --rounds 4 \
  --variant base= --variant apart=tfd_kernels.hyper_mix.MIX_PROMPT_APART=1 --out $R/fn > $R/fn.txt 2>&1
echo "fn rc=$? t=$(el)"; grep -a "prefill\|rror" $R/fn.txt | cut -c1-300
case "$CARD" in
*H200*)
  timeout 80 tfd bench --shape qwen3_8-flash-next --streams 1,32 --prompt 1024 --new 256 --out $R/fn-bars \
    > $R/fn-bars.txt 2>&1; echo "bars rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/fn-bars.txt | cut -c1-300
  for p in 32768 1024; do
    [ $(el) -lt 500 ] || break
    timeout $(( 570 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt $p --new 64 --out $R/long \
      > $R/long-$p.txt 2>&1; echo "long $p rc=$? t=$(el)"; grep -a "qwen3_8\|rror" $R/long-$p.txt | cut -c1-300
  done ;;
*)
  timeout 90 tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 8 --profile \
    --out $R/fn-profile > $R/fn-profile.txt 2>&1; echo "profile rc=$? t=$(el)"
  grep -a "prefill\|idle\|rror" $R/fn-profile.txt | head -8 | cut -c1-300
  [ $(el) -lt 480 ] && SWEEP=mix timeout 70 python .dev/hyper_prompt_sweep.py 2>&1 | grep -v "arn" > $R/sweep.txt
  echo "sweep t=$(el)"; cut -c1-300 $R/sweep.txt | head -20 ;;
esac
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Forty-second session, the call after s43a.sh (an H200): issue 31's acceptance point not yet run, the conformance
# kit's full profile against the Flash Next demo daemon (contexts past its budget), then the 35B-A3B's 8 x 1,024
# prefill (34.4% of the matmul rate, bar 35%) under the prompt pass's scheduling and pipeline variants (the same
# bits: the bench compares the tokens). ~520 s. Carry .whl .whl-test .devk.
. .dev/start.sh
bash .dev/demo_conformance.sh flashnext full flashnext; echo "conformance t=$(el)"
timeout $(( 520 - $(el) )) tfd bench --shape qwen3_5-35b-a3b --streams 8 --prompt 1024 --new 8 --rounds 3 \
  --variant base= --variant g16=tfd_kernels.moe.PROMPT_GROUP=16 --variant g64=tfd_kernels.moe.PROMPT_GROUP=64 \
  --variant gs3=tfd_kernels.moe.PROMPT_GATE_STAGES=3 --variant ds3=tfd_kernels.moe.PROMPT_DOWN_STAGES=3 \
  --out $R/35b-prompt > $R/35b-prompt.txt 2>&1; echo "35b rc=$? t=$(el)"
grep -a "x8:\|prefill\|rror" $R/35b-prompt.txt | cut -c1-300
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Thirty-eighth session: issue 31's other two prefill shapes with the GDN output fused, apart, and as
# FUSE_PROGRAMS chooses (Flash Next's one lane: apart; the 80B-A3B's eight: fused), then the dense products' whole form at
# 8,192 rows, the plan's 128 x 128 x 128 in 3 stages against 128 x 128 x 64 in 4 and 5, now with the 9B's
# shapes too (gemm_prefill_sweep.py SWEEP=short). ~500 s. Carry .whl .whl-test .dev.
. .dev/start.sh
for s in qwen3_8-flash-next:1 qwen3_next-80b-a3b:8; do
  timeout $(( 380 - $(el) )) tfd bench --shape ${s%:*} --streams ${s#*:} --prompt 1024 --new 8 --rounds 2 \
    --variant auto= --variant fused=tfd_kernels.gdn_prefill.FUSE_PROGRAMS=0 \
    --variant apart=tfd_kernels.gdn_prefill.FUSE_PROGRAMS=1073741824 --out $R/${s%:*} 2>&1 \
    | grep -a "prefill\|rror\|variant" | cut -c1-300
  echo "bench ${s%:*} t=$(el)"
done
SWEEP=short timeout $(( 570 - $(el) )) python .dev/gemm_prefill_sweep.py 2>&1 | tee $R/gemm-prefill-sweep.txt \
  | cut -c1-400
echo "sweep t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

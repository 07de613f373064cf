#!/usr/bin/env bash
# Fortieth session's second call (an H100, warm): s40a's GPU tests again with the time they need (the ring's,
# then the device path's; 18 of 33 passed in s40a's 100 s, none failed), then s38c.sh's Flash Next prefill with
# the GDN output fused, apart and as FUSE_PROGRAMS chooses, and the 9B's whole-form prefill tiles
# (gemm_prefill_sweep.py SWEEP=short). ~570 s. Carry .whl .whl-test .dev .devcache.
. .dev/start.sh
gpu_tests 230 8 tests/pool/test_staging.py tests/engine/test_device_path.py -k "not wide and not two-streams"
timeout $(( 400 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 8 --rounds 2 \
  --variant auto= --variant fused=tfd_kernels.gdn_prefill.FUSE_PROGRAMS=0 \
  --variant apart=tfd_kernels.gdn_prefill.FUSE_PROGRAMS=1073741824 --out $R/fn 2>&1 \
  | grep -a "prefill\|rror\|variant" | cut -c1-300
echo "bench t=$(el)"
SWEEP=short timeout $(( 575 - $(el) )) python .dev/gemm_prefill_sweep.py 2>&1 | tee $R/gemm-prefill-sweep.txt \
  | cut -c1-400
echo "sweep t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

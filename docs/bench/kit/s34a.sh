#!/usr/bin/env bash
# The next session's first call (issue 31's prefill, issue 35's test): the GDN prefill's refined inverse
# (gdn_chunk.REFINED: one-pass T, a Newton step, two-pass W and U; 200 wgmma of 368, 48 KB of shared memory
# of 96, no spills offline) timed beside base and one-pass tf32 (gdn_sweep.py), its GPU test at real sizes
# (REAL_TOL, both dtypes) and the tensor-parallel GPU test's new first-token rule; then the 35B-A3B's 8 x 1,024
# prefill with it and with PROMPT_GROUP=32, two rounds, tokens compared; Flash Next's 1 x 1,024 the same. On an
# H200, resume_serve.sh first (issue 36's page-cache point on the card its acceptance names).
# SHORT=1 (a budget mostly spent on refused starts, under ~800 s left): the GPU tests only while the
# first 330 s last, and no 35B-A3B or Flash Next bench; ends by 500 s.
# Carry .whl .whl-test .dev .devcache-tp.
. .dev/start.sh
timeout 120 python .dev/gdn_sweep.py base refined tf32 2>&1 | tee $R/gdn_sweep.txt | cut -c1-300; echo "sweep t=$(el)"
LAST=$([ -n "${SHORT:-}" ] && echo 500 || echo $(( $(el) + 200 )))
[ -z "${SHORT:-}" ] || [ $(el) -lt 330 ] && TMPDIR=$PWD/.devcache-tp timeout $(( LAST - $(el) )) \
  python -m pytest -q -m gpu -n 4 -p no:cacheprovider -p no:benchmark -W ignore::DeprecationWarning \
  tests/kernels/test_gdn_prefill.py tests/model/test_tensor_parallel_gpu.py 2>&1 \
  | tee $R/gpu_tests.txt | grep -a "passed\|failed\|^E " | head -12 | cut -c1-250; echo "tests t=$(el)"
[ -n "${SHORT:-}" ] && { echo "t=$(el)"; cd $OUT && tar czf r.tgz r && rm -rf r; exit 0; }
G=tfd_kernels.gdn_chunk.REFINED; M=tfd_kernels.moe.PROMPT_GROUP
timeout $(( 560 - $(el) )) tfd bench --shape qwen3_5-35b-a3b --streams 8 --prompt 1024 --new 8 --rounds 2 \
  --variant base= --variant refined=$G=1 --variant group32=$M=32 --variant both=$G=1,$M=32 --out $R/var 2>&1 \
  | grep -a "best of\|rror" | cut -c1-300; echo "35b t=$(el)"
[ $(el) -lt 470 ] && timeout $(( 570 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 8 \
  --rounds 2 --variant base= --variant refined=$G=1 --out $R/var 2>&1 | grep -a "best of\|rror" | cut -c1-300
echo "t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

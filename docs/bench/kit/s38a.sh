#!/usr/bin/env bash
# Thirty-eighth session, first call (ran at 202ec9a, where gdn_prefill.FUSED chose the walk's output; FUSE_PROGRAMS since): the GPU tests (the GDN prefill's real sizes, its output formed in phase
# two's walk with the bits of its own launch; the device path, the MoE, drafting, the grammar lanes: the steps'
# inputs packed from kept tails, b0588e4, not yet on a GPU), then the GDN prefill's launches alone under
# gdn_sweep.py's variants, then the 35B-A3B's 8 x 1,024 prefill with the output fused and apart. ~570 s.
# Carry .whl .whl-test .dev .devcache.
. .dev/start.sh
TMPDIR=$PWD/.devcache timeout 230 python -m pytest -q -m gpu -n 4 -p no:cacheprovider -p no:benchmark \
  -W ignore::DeprecationWarning tests/kernels/test_gdn_prefill.py tests/pool/test_staging.py tests/engine/test_device_path.py \
  tests/kernels/test_moe_gpu.py tests/engine/test_drafting.py tests/engine/test_grammar_lanes.py \
  -k "not wide and not two-streams" 2>&1 | tee $R/gpu-tests.txt | grep -a "passed\|failed\|FAILED\|Error" \
  | cut -c1-250 | tail -12
echo "tests t=$(el)"
timeout 200 python .dev/gdn_sweep.py base apart bv16 st1 st3 2>&1 | tee $R/gdn-sweep.txt | cut -c1-250
echo "sweep t=$(el)"
timeout $(( 575 - $(el) )) tfd bench --shape qwen3_5-35b-a3b --streams 8 --prompt 1024 --new 8 --rounds 2 \
  --variant fused= --variant apart=tfd_kernels.gdn_prefill.FUSED=0 --out $R/qwen3_5-35b-a3b 2>&1 \
  | grep -a "prefill\|rror\|variant" | cut -c1-300
echo "bench t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

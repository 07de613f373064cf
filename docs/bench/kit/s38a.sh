#!/usr/bin/env bash
# Thirty-eighth session, first call: the GDN prefill's output formed in phase two's walk (FUSED) against its
# own launch, through the bench at the three prefill shapes, after the GPU tests (the GDN prefill's real
# sizes with fused == apart bits; the device path, the MoE, drafting, the grammar lanes: the steps' inputs
# packed from kept tails, b0588e4, not yet on a GPU); the demo's grammar bench if time is left. ~560 s.
# Carry .whl .whl-test .dev .devcache.
. .dev/start.sh
TMPDIR=$PWD/.devcache timeout 250 python -m pytest -q -m gpu -n 4 -p no:cacheprovider -p no:benchmark \
  -W ignore::DeprecationWarning tests/kernels/test_gdn_prefill.py tests/engine/test_device_path.py \
  tests/kernels/test_moe_gpu.py tests/engine/test_drafting.py tests/engine/test_grammar_lanes.py \
  -k "not wide and not two-streams" 2>&1 | tee $R/gpu-tests.txt | grep -a "passed\|failed\|FAILED\|Error" \
  | cut -c1-250 | tail -12
echo "tests t=$(el)"
APART=tfd_kernels.gdn_prefill.FUSED=0
for s in qwen3_5-35b-a3b:8 qwen3_8-flash-next:1 qwen3_next-80b-a3b:8; do
  [ $(el) -lt 470 ] || break
  timeout $(( 560 - $(el) )) tfd bench --shape ${s%:*} --streams ${s#*:} --prompt 1024 --new 8 --rounds 2 \
    --variant fused= --variant apart=$APART --out $R/${s%:*} 2>&1 | grep -a "prefill\|rror\|variant" | cut -c1-300
  echo "bench ${s%:*} t=$(el)"
done
if [ $(el) -lt 500 ]; then
  timeout $(( 585 - $(el) )) tfd bench --streams 32,1 --prompt 1024 --new 256 --grammar none,json --out $R/demo \
    > $R/demo.txt 2>&1; echo "demo rc=$? t=$(el)"; grep -a "tok/s" $R/demo.txt | cut -c1-250
fi
cd $OUT && tar czf r.tgz r && rm -rf r

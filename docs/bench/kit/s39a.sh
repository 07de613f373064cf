#!/usr/bin/env bash
# Thirty-ninth session, first call (an H200): the pinned ring's GPU tests and the device path with it
# (a40f132: every to_device through one ring a device), then issue 31's acceptance runs on the card it
# names: Flash Next at 1, 8 and 32 streams (1,024-token prompts, 256 new), then the MoE shapes' 8 x 1,024
# prefill (two rounds) with FUSE_PROGRAMS's choice. ~560 s. Carry .whl .whl-test .dev .devcache.
# TESTS=0: the benches alone (s40d.sh on an H200; then .devcache need not be carried).
. .dev/start.sh
[ "${TESTS:-1}" = 1 ] && gpu_tests 100 4 tests/pool/test_staging.py tests/engine/test_device_path.py -k "not wide and not two-streams"
timeout $(( 330 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1,8,32 --prompt 1024 --new 256 \
  --out $R/fn > $R/fn.txt 2>&1; echo "fn rc=$? t=$(el)"; grep -a "qwen3_8\|rror\|roofline" $R/fn.txt | cut -c1-300
for s in qwen3_5-35b-a3b qwen3_next-80b-a3b; do
  [ $(el) -lt 480 ] || break
  timeout $(( 575 - $(el) )) tfd bench --shape $s --streams 8 --prompt 1024 --new 8 --rounds 2 --out $R/$s \
    > $R/$s.txt 2>&1; echo "$s rc=$? t=$(el)"; grep -a "prefill\|rror" $R/$s.txt | cut -c1-300
done
cd $OUT && tar czf r.tgz r && rm -rf r

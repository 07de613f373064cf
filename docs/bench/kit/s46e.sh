#!/usr/bin/env bash
# Forty-fourth session, last call (~300 s, either card): the device path's GPU tests after PromptLanes.of went to
# numpy and one packed copy (every prompt pass on CUDA) with QSA's segments on by default; the 35B-A3B's 8 x 1,024
# prefill step's gaps again (s46d.sh on the H100: 129.0 ms, 1.32 ms idle while PromptLanes.of ran); Flash Next's
# one stream with a QSA prompt's rows before its whole prefix as dense rows (DENSE_PREFIX). Carry .whl .whl-test
# .devk .devcache.
. .dev/start.sh
gpu_tests 110 8 -rE tests/engine/test_device_path.py -k "not 9b"
grep -a "^ERROR\|^FAILED\|^E  " $R/gpu-tests.txt | cut -c1-200 | head -8
GAPS_STACKS=0 timeout $(( 200 - $(el) )) python .dev/prefill_gaps.py qwen3_5-35b-a3b 8 1024 $R 2>&1 \
  | grep -v "arn\|^ *_warn" > $R/gaps.txt; echo "gaps t=$(el)"; head -22 $R/gaps.txt | cut -c1-130
timeout $(( 300 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 64 --rounds 2 \
  --variant base= --variant dense=tfd.model.attention.DENSE_PREFIX=1 --out $R/fn > $R/fn.txt 2>&1
echo "fn rc=$? t=$(el)"; grep -a "x1:\|rror" $R/fn.txt | cut -c1-300
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Issue 31: the prefill step's idle device time (prefill_gaps.py): Flash Next at 1 x 1,024, the 35B-A3B at
# 8 x 1,024. ~250 s. Carry .whl .whl-test .dev.
. .dev/start.sh
for s in qwen3_8-flash-next:1 qwen3_5-35b-a3b:8; do
  [ $(el) -lt 380 ] || break
  timeout $(( 560 - $(el) )) python .dev/prefill_gaps.py ${s%:*} ${s#*:} 1024 $R 2>&1 | grep -v "arn\|^ *_warn" \
    | tee $R/gaps-${s%:*}.txt | cut -c1-260
  echo "t=$(el)"
done
cd $OUT && tar czf r.tgz r && rm -rf r

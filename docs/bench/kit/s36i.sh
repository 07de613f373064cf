#!/usr/bin/env bash
# Issue 31: after the lanes' cheaper opening (a fill a run of state pages, views by as_strided) and the
# step's span ids in one copy: the 35B-A3B's idle in its 8 x 1,024 prefill step (prefill_gaps.py, no stacks),
# then the three prefill benches, two rounds. ~170 s. Carry .whl .whl-test .dev.
. .dev/start.sh
GAPS_STACKS=0 timeout 100 python .dev/prefill_gaps.py qwen3_5-35b-a3b 8 1024 $R 2>&1 | grep -v "arn\|^ *_warn" \
  | tee $R/gaps-after.txt | head -12 | cut -c1-200
echo "gaps t=$(el)"
prefill_benches 150 215
echo "t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

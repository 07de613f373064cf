#!/usr/bin/env bash
# Issue 31: after the lanes' cheaper opening (a fill a run of state pages, views by as_strided) and the
# step's span ids in one copy: the 35B-A3B's idle in its 8 x 1,024 prefill step (prefill_gaps.py, no stacks),
# then the three prefill benches, two rounds. ~170 s. Carry .whl .whl-test .dev.
. .dev/start.sh
prefill_idle
prefill_benches 150 215
echo "t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

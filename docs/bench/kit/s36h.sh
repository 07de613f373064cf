#!/usr/bin/env bash
# Issue 31: prefill_gaps.py again on the 35B-A3B's 8 x 1,024, with the tree of the host's calls before the
# step's first long kernel. ~110 s. Carry .whl .whl-test .dev.
. .dev/start.sh
timeout 300 python .dev/prefill_gaps.py qwen3_5-35b-a3b 8 1024 $R 2>&1 | grep -v "arn\|^ *_warn" \
  | tee $R/gaps-tree.txt | cut -c1-220
echo "t=$(el)"
cd $OUT && tar czf r.tgz r && rm -rf r

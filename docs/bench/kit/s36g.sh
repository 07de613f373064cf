#!/usr/bin/env bash
# Issue 31: the prefill step's host side by cProfile (prefill_host.py): the 35B-A3B at 8 x 1,024, Flash Next at
# 1 x 1,024. ~200 s. Carry .whl .whl-test .dev.
. .dev/start.sh
for s in qwen3_5-35b-a3b:8 qwen3_8-flash-next:1; do
  [ $(el) -lt 400 ] || break
  timeout $(( 560 - $(el) )) python .dev/prefill_host.py ${s%:*} ${s#*:} 1024 2>&1 | grep -v "arn\|^ *_warn" \
    > $R/host-${s%:*}.txt; head -60 $R/host-${s%:*}.txt | cut -c1-200
  echo "t=$(el)"
done
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# For the forty-fifth session's last call, any card (~560 s): issue 31's conformance point (s47e.sh: the full
# profile against the Flash Next demo daemon, contexts past its QSA budget); then where the host's time goes in
# Flash Next's 1 x 1,024 prefill, which followed the host's speed in s47c.sh/s47d.sh (prefill_host.py: cProfile);
# then the 35B-A3B's 8 x 1,024 prefill gaps with Python stacks (s47d.sh: 3.18 ms from the first GDN layer's
# gates to the prompt lanes' copy, 2.92 ms of it in one aten::copy_). Carry .whl .whl-test .devk.
. .dev/start.sh
bash .dev/demo_conformance.sh flashnext full flashnext; echo "conformance t=$(el)"
timeout 100 python .dev/prefill_host.py qwen3_8-flash-next 1 1024 2>&1 | grep -v "arn" > $R/host-fn.txt
echo "host t=$(el)"; head -45 $R/host-fn.txt | cut -c1-160
timeout $(( 560 - $(el) )) python .dev/prefill_gaps.py qwen3_5-35b-a3b 8 1024 $R 2>&1 | grep -v "arn\|^ *_warn" \
  > $R/gaps-stacks.txt; echo "gaps t=$(el)"; grep -a -A25 "^gap 3\|^gap 2\|^gap 1" $R/gaps-stacks.txt | tail -40 | cut -c1-160
cd $OUT && tar czf r.tgz r && rm -rf r

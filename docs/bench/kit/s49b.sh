#!/usr/bin/env bash
# Forty-seventh session's second call (~560 s, any card; meant for a warm H200 after s49a.sh): issue 31's
# conformance point, the full profile against the Flash Next demo daemon started from /tmp as a user starts it
# (contexts past its QSA budget; nothing may compile while serving); then the one-stream step profiled kernel by
# kernel at the bench shape (`--profile`), for where the x1 bar's time goes. Carry .whl .whl-test .devk.
. .dev/start.sh
bash .dev/demo_conformance.sh flashnext full flashnext; echo "conformance t=$(el)"
timeout $(( 560 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 64 --profile \
  --out $R/fn-profile > $R/fn-profile.txt 2>&1; echo "profile rc=$? t=$(el)"
grep -a "qwen3_8\|rror" $R/fn-profile.txt | cut -c1-300
f=$(ls $R/fn-profile/*decode.txt 2>/dev/null | head -1); [ -n "$f" ] && sed -n '/^kernel /,/^steps/p' $f | head -40 | cut -c1-110
cd $OUT && tar czf r.tgz r && rm -rf r

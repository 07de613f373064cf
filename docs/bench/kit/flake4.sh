#!/usr/bin/env bash
# Issue 36's identity probe, the next bisection step (2026-12-05, H100: with graphs 5 of 20 starts computed
# another probe state; without graphs 0 of 16; drafts do not matter; the engine alone, graphs on, 4 lanes
# and a small pool, never moved). Every arm keeps graphs on and changes one thing the engine-alone probe had:
# a small pool (TF_POOL_GIB=1), few lanes (TF_PARALLEL=4: graphs for 1, 2, 4 lanes only), then the default
# again as the control. Six starts each; a start's log kept where its digest is not the arm's first.
# Carry .whl .dev.
[ -x /tmp/site/bin/tfd ] || bash .dev/install.sh > /dev/null 2>&1 || { echo install fails; exit 1; }
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site TRITON_CACHE_DIR=/tmp/triton TF_LEARN_CONVERSATIONS=1 \
  TF_LEARN_DIR=/tmp/l TF_ADMIN_SOCKET=/tmp/a.sock
R=$OUT/r; mkdir -p $R
cd /tmp
starts() {  # $1: label; TF_ settings come from the environment of the call
  label=$1; digests=""; first=""
  for i in 1 2 3 4 5 6; do
    log=/tmp/s-$label-$i.log
    timeout 90 tfd serve > $log 2>&1 & p=$!
    for t in $(seq 1 88); do sleep 1; grep -q "ready:" $log && break; done
    kill -TERM $p 2>/dev/null; wait $p
    digest=$(grep -ao "the probe's state [0-9a-f]*" $log | cut -c19-26)
    [ -z "$first" ] && first=$digest && cp $log $R/
    [ "$digest" != "$first" ] && cp $log $R/
    digests="$digests ${digest:-none}"
  done
  echo "$label:$digests"
}
TF_POOL_GIB=1 starts pool-1gib
TF_PARALLEL=4 starts lanes-4
starts default
cd $OUT && tar czf r.tgz r && rm -rf r

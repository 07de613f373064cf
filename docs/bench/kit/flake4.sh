#!/usr/bin/env bash
# Issue 36's identity probe after its cause was found (2026-12-05, thirtieth session: the digest hashed a
# temporary `part.cpu()` through a view that did not keep it alive, so a start read freed host memory; with
# graphs 5 of 20 starts on the H100 gave another digest, without 0 of 16). The check: the demo daemon
# started 10 times with graphs through probe_parts_serve.py (the digest part by part), then 4 times
# without graphs: one probe state at all 14 starts. A start's log kept where its digest is not the arm's first.
# Carry .whl .dev.
[ -x /tmp/site/bin/tfd ] || bash .dev/install.sh > /dev/null 2>&1 || { echo install fails; exit 1; }
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site TRITON_CACHE_DIR=/tmp/triton TF_LEARN_CONVERSATIONS=1 \
  TF_LEARN_DIR=/tmp/l TF_ADMIN_SOCKET=/tmp/a.sock
R=$OUT/r; mkdir -p $R
cd /tmp
KIT=$OLDPWD/.dev
starts() {  # $1: label, $2: starts; the command after; TF_ settings come from the environment of the call
  label=$1; count=$2; shift 2; digests=""; first=""
  for i in $(seq 1 $count); do
    log=/tmp/s-$label-$i.log
    timeout 90 "$@" serve > $log 2>&1 & p=$!
    for t in $(seq 1 88); do sleep 1; grep -q "ready:" $log && break; done
    kill -TERM $p 2>/dev/null; wait $p
    digest=$(grep -ao "the probe's state [0-9a-f]*" $log | cut -c19-26)
    [ -z "$first" ] && first=$digest && cp $log $R/
    [ "$digest" != "$first" ] && cp $log $R/
    digests="$digests ${digest:-none}"
  done
  echo "$label:$digests"
}
starts default 10 python $KIT/probe_parts_serve.py
python $KIT/parts_moved.py /tmp/s-default-*.log  # the probe state's parts that moved between starts
TF_CUDA_GRAPHS=0 starts no-graphs 4 tfd
cd $OUT && tar czf r.tgz r && rm -rf r

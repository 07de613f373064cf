#!/usr/bin/env bash
# no graphs 6 starts (stable in 4 before?), then the tp gpu test's full output.
[ -x /tmp/site/bin/tfd ] || bash .dev/install.sh > /dev/null 2>&1
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site TRITON_CACHE_DIR=/tmp/triton TF_LEARN_CONVERSATIONS=1 \
  TF_LEARN_DIR=/tmp/l TF_ADMIN_SOCKET=/tmp/a.sock
R=$OUT/r; mkdir -p $R
cp /tmp/s-plain-*.log /tmp/s-no-pdl-*.log $R/ 2>/dev/null
cd /tmp
starts() {
  label=$1; shift; digests=""
  for i in 1 2 3 4 5 6; do
    log=/tmp/s-$label-$i.log
    timeout 90 "$@" serve > $log 2>&1 & p=$!
    for t in $(seq 1 88); do sleep 1; grep -q "ready:" $log && break; done
    kill -TERM $p; wait $p
    digests="$digests $(grep -ao "the probe's state [0-9a-f]*" $log | cut -c19-26)"
    cp $log $R/
  done
  echo "$label:$digests"
}
TF_CUDA_GRAPHS=0 starts nog tfd
cd $OUT && tar czf r.tgz r && rm -rf r

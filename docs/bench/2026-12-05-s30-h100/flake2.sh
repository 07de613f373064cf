#!/usr/bin/env bash
# identity_flake.sh's default arm with the plain console script, then no-drafts and no-pdl; logs kept.
[ -x /tmp/site/bin/tfd ] || bash .dev/install.sh > /dev/null 2>&1
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site TRITON_CACHE_DIR=/tmp/triton TF_LEARN_CONVERSATIONS=1 \
  TF_LEARN_DIR=/tmp/l TF_ADMIN_SOCKET=/tmp/a.sock
KIT=$PWD/.dev; R=$OUT/r; mkdir -p $R
cp /tmp/s-default-1.log $R/parts-default-1.log 2>/dev/null
cd /tmp
nopdl() { python -c "import sys, tfd_kernels.pdl as p; p.ENABLED = False; from tfd.cli import main; sys.argv[0] = 'tfd'; sys.exit(main())" "$@"; }
starts() {
  label=$1; shift; digests=""
  for i in 1 2 3 4; do
    log=/tmp/s-$label-$i.log
    timeout 90 "$@" serve > $log 2>&1 & p=$!
    for t in $(seq 1 88); do sleep 1; grep -q "ready:" $log && break; done
    kill -TERM $p; wait $p
    digests="$digests $(grep -ao "the probe's state [0-9a-f]*" $log | cut -c19-26)"
    cp $log $R/
  done
  echo "$label:$digests"
}
starts plain tfd
TF_DRAFTS=0 starts no-drafts tfd
starts no-pdl nopdl
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Issue 36: the identity probe's state moved from one start of the same daemon to the next on the GPU (the demo:
# 5 starts, 3 digests; the CPU: always the same, with a full warm-up too; the engine alone on the GPU, on a
# pool zeroed or full of random bytes: always the same, probe_gpu.py). Bisect: the demo daemon started 4 times
# under each setting; a setting whose 4 digests agree (and the default's do not) holds the cause.
# Carry .whl .dev.
bash .dev/install.sh > /dev/null 2>&1 || { echo install fails; exit 1; }
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site TRITON_CACHE_DIR=/tmp/triton TF_LEARN_CONVERSATIONS=1 \
  TF_LEARN_DIR=/tmp/l TF_ADMIN_SOCKET=/tmp/a.sock
KIT=$PWD/.dev
cd /tmp
nopdl() { exec python -c "import sys, tfd_kernels.pdl as p; p.ENABLED = False; from tfd.cli import main; sys.argv[0] = 'tfd'; sys.exit(main())" "$@"; }
starts() {  # $1: label; the rest: the command
  label=$1; shift; digests=""
  for i in 1 2 3 4; do
    log=/tmp/s-$label-$i.log
    timeout 60 bash -c '"$@" serve' _ "$@" > $log 2>&1 & p=$!  # bash -c: the command may be a function
    for t in $(seq 1 58); do sleep 1; grep -q "ready:" $log && break; done
    kill -TERM $p; wait $p
    digests="$digests $(grep -ao "the probe's state [0-9a-f]*" $log | cut -c19-26)"
  done
  echo "$label:$digests"
}
parts() { exec python $KIT/probe_parts_serve.py "$@"; }
export -f nopdl parts; export KIT
starts default parts
python $KIT/parts_moved.py /tmp/s-default-*.log  # the probe state's parts that moved between starts
TF_WARM_UP=short starts warm-up-short tfd
TF_CUDA_GRAPHS=0 starts no-graphs tfd
TF_DRAFTS=0 starts no-drafts tfd
starts no-pdl nopdl

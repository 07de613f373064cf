#!/usr/bin/env bash
# Where a grammar step's time goes: 9B x32 --grammar json with torch's CPU threads at 2 and at the
# default, and one profiled run of each of none and json.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh > /dev/null 2>&1 || { echo install fails; exit 1; }
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R; cd /tmp
for threads in 2 16; do
  OMP_NUM_THREADS=$threads timeout 150 tfd bench --shape qwen3_5-9b --streams 32 --prompt 1024 --new 256 \
    --grammar none,json --out $R/omp$threads > $R/omp$threads.txt 2>&1
  echo "omp $threads rc=$? t=$(el)"; grep -a "tok/s" $R/omp$threads.txt | tail -2
done
timeout 200 tfd bench --shape qwen3_5-9b --streams 32 --prompt 1024 --new 128 --grammar none,json --profile \
  --out $R/prof > $R/prof.txt 2>&1; echo "prof rc=$? t=$(el)"; grep -a "tok/s" $R/prof.txt | tail -2
ls $R/prof | head; cd $OUT && tar czf r.tgz r && rm -rf r

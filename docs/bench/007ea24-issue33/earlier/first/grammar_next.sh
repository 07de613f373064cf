#!/usr/bin/env bash
# Where a grammar step's time goes now (grammar_timeline.py: host parts and device spans by CUDA
# events), 9B and demo x32, json against none; and the parts timed alone (grammar_parts.py).
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
ROOT=$PWD
bash .dev/install.sh > /dev/null 2>&1 || { echo install fails; exit 1; }
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R; cd /tmp
for g in json none; do
  timeout 170 python $ROOT/.dev/grammar_timeline.py --shape qwen3_5-9b --streams 32 --prompt 1024 --new 128 \
    --grammar $g --out $R/9b-$g > $R/9b-$g.txt 2>&1; echo "9b $g rc=$? t=$(el)"
  grep -a "tok/s" $R/9b-$g.txt | tail -1; grep -a TIMELINE $R/9b-$g.txt
done
for g in json none; do
  timeout 60 python $ROOT/.dev/grammar_timeline.py --streams 32 --prompt 1024 --new 128 --grammar $g \
    --out $R/demo-$g > $R/demo-$g.txt 2>&1; echo "demo $g rc=$? t=$(el)"
  grep -a "tok/s" $R/demo-$g.txt | tail -1; grep -a TIMELINE $R/demo-$g.txt
done
timeout 90 python $ROOT/.dev/grammar_parts.py > $R/parts.txt 2>&1; echo "parts rc=$? t=$(el)"; tail -2 $R/parts.txt
cd $OUT && tar czf r.tgz r && rm -rf r

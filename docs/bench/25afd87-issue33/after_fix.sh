#!/usr/bin/env bash
# After the pinned mask buffer (5ef28d5): the grammar's cost again (9B x32 and x1, the demo x32), and the
# GDN decode kernel tests after the references moved (kernels/gdn_reference.py). Carry .whl .whl-test .devcache .dev.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
ROOT=$PWD
bash .dev/install.sh .whl-test > /dev/null 2>&1 || { echo install fails; exit 1; }
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R; cd /tmp
timeout 200 tfd bench --shape qwen3_5-9b --streams 32,1 --prompt 1024 --new 256 --grammar none,json --out $R/9b \
  > $R/9b.txt 2>&1; echo "9b rc=$? t=$(el)"; grep -a "tok/s" $R/9b.txt
timeout 100 tfd bench --streams 32 --prompt 1024 --new 256 --grammar none,json --out $R/demo > $R/demo.txt 2>&1
echo "demo rc=$? t=$(el)"; grep -a "tok/s" $R/demo.txt
cd $ROOT && PYTHONPATH=/tmp/site TMPDIR=$ROOT/.devcache timeout 150 python -m pytest -q -m gpu -n 4 \
  -p no:cacheprovider -p no:benchmark -W ignore::DeprecationWarning tests/kernels/test_gdn_decode.py \
  tests/model/test_verify.py > $R/gdn_tests.txt 2>&1; echo "gdn tests rc=$? t=$(el)"
tail -3 $R/gdn_tests.txt
cd $OUT && tar czf r.tgz r && rm -rf r

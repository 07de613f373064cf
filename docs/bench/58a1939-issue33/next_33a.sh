#!/usr/bin/env bash
# Issue 33's H200 acceptance: decode with a JSON-schema grammar on every lane against plain decode, the
# demo and the 9B shape at 1 and 32 streams, interleaved over two rounds (tfd bench --grammar none,json:
# the grammar a list of records, so no stream ends early; the 9B's tokenizer the one tfd serve --shape
# serves it with). Carry .whl (with llguidance's wheel, manylinux_2_31) and .dev.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
bash .dev/install.sh || { echo install fails; exit 1; }
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
cd /tmp
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > $R/gpu.txt 2>&1
timeout 240 tfd bench --streams 1,32 --prompt 1024 --new 256 --grammar none,json --rounds 2 --out $R/demo \
  > $R/demo.txt 2>&1; echo "demo rc=$? t=$(el)"; grep -a "tok/s" $R/demo.txt | tail -10
timeout 330 tfd bench --shape qwen3_5-9b --streams 1,32 --prompt 1024 --new 256 --grammar none,json --rounds 2 \
  --out $R/9b > $R/9b.txt 2>&1; echo "9b rc=$? t=$(el)"; grep -a "tok/s" $R/9b.txt | tail -10
cd $OUT && tar czf r.tgz r && rm -rf r

#!/usr/bin/env bash
# Issue 31 point 2: which decode-graph bucket (or PDL) breaks Flash Next at 32 streams.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
python -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1 || { echo pip fails; exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
go() {  # name, timeout, args
  local name=$1 limit=$2; shift 2
  [ $(el) -gt 420 ] && { echo "$name: skipped at t=$(el)"; return; }
  timeout $limit "$@" > $R/$name.txt 2>&1; local rc=$?
}
go g12 150 python .dev31/check2.py graphs 4 12
go p2_32 100 python .dev31/check2.py graphs 4 32 1,2,4,8,16
go nopdl32 100 python .dev31/check2.py nopdl 4 32
go g16 100 python .dev31/check2.py graphs 4 16
go g9 100 python .dev31/check2.py graphs 4 9
compute-sanitizer --version 2>&1 | head -2
export PROMPT=64; go san12 200 compute-sanitizer --tool memcheck --print-limit 20 python .dev31/check2.py graphs 4 12
grep -n "=====" $R/san12.txt 2>/dev/null | head -40 | cut -c1-250
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
[1 lines of the device-side assertion message left out]

#!/usr/bin/env bash
# Issue 32's H200 acceptance, call C: conformance's full profile against the demo daemon before (937d261,
# .dev/before.tgz; before_site.sh says how to make it) and after (0116906 from .dev/after.tgz when carried,
# else the working tree), then --compare key by key.
# Carry .whl .dev.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
bash .dev/before_site.sh || { echo install fails; exit 1; }
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R
cd /tmp
for side in before after; do
  site=/tmp/site; [ $side = before ] && site=/tmp/bsite; [ $side = after ] && [ -d /tmp/asite ] && site=/tmp/asite
  PYTHONPATH=$site TF_ADMIN_SOCKET=/tmp/$side.sock python -m tfd serve > $R/$side-serve.log 2>&1 &
  pid=$!
  until python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)" \
      2>/dev/null; do sleep 1; kill -0 $pid 2>/dev/null || { echo "$side server died"; break; }; done
  echo "$side READY t=$(el)"
  # the kit of the trees compared, not a later one: the after tree's, or with KIT=before the before tree's
  client=/tmp/site; [ -d /tmp/asite ] && client=/tmp/asite; [ "${KIT:-}" = before ] && client=/tmp/bsite
  PYTHONPATH=$client timeout 200 python -m tfd conformance --url http://127.0.0.1:8000 --admin /tmp/$side.sock \
    --profile full --json $R/$side.json > $R/$side.txt 2>&1; echo "$side conformance rc=$? t=$(el)"
  tail -9 $R/$side.txt
  kill -TERM $pid; wait $pid; grep -av tfd.access $R/$side-serve.log > $R/s && mv $R/s $R/$side-serve.log
done
PYTHONPATH=$client python -m tfd conformance --compare $R/before.json $R/after.json | tee $R/compare.txt
cd $OUT && tar czf r.tgz r && rm -rf r

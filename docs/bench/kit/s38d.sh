#!/usr/bin/env bash
# Thirty-eighth session, last seconds of device time: s38b.sh cut to one round (the demo's json and plain
# steps with the grammar fill started before the lanes' bookkeeping, against the engine files of df21f56),
# then grammar_threads.py on the device host. ~180 s. Carry .whl .whl-test .dev.
. .dev/start.sh
mkdir -p /tmp/old && cp -r /tmp/site/tfd /tmp/old/ && cp .dev/old/*.py /tmp/old/tfd/engine/
for which in new old; do
  [ $which = old ] && P=/tmp/old:/tmp/site || P=/tmp/site
  PYTHONPATH=$P timeout 60 tfd bench --streams 32 --prompt 1024 --new 256 --grammar none,json \
    --out $R/demo-$which > $R/demo-$which.txt 2>&1
  echo "$which rc=$? t=$(el)"; grep -a "tok/s" $R/demo-$which.txt | cut -c1-200
done
timeout 50 python .dev/grammar_threads.py > $R/grammar-threads.txt 2>&1; echo "threads rc=$? t=$(el)"
grep -a "one call\|a lane" $R/grammar-threads.txt
cd $OUT && tar czf r.tgz r && rm -rf r

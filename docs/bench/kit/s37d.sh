#!/usr/bin/env bash
# Thirty-seventh session, fourth call: issue 33's demo half sampled by py-spy (every thread, idle samples
# kept, raw collapsed stacks): the demo x32 decode with the JSON grammar and without, 1,024 new tokens each.
# ~120 s. Carry .whl .whl-test (py-spy's wheel in it) .dev.
. .dev/start.sh
for g in json none; do
  timeout 150 py-spy record -r 2000 --idle --threads --format raw -o $R/demo-$g.raw -- \
    tfd bench --streams 32 --prompt 1024 --new 1024 --grammar $g > $R/demo-$g.txt 2>&1
  echo "$g rc=$? t=$(el)"; grep -a "tok/s" $R/demo-$g.txt | cut -c1-250; ls -la $R/demo-$g.raw
done
cd $OUT && tar czf r.tgz r && rm -rf r

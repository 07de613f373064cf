#!/usr/bin/env bash
# Issue 32's H200 acceptance, call A: qwen3_5-9b at 1 and 32 streams, before (937d261, .dev/before.tgz)
# and after (the working tree) interleaved A B A B: tfd bench's step times and the tokens' digest.
# Carry .whl .dev (with .dev/before.tgz: before_site.sh says how to make it).
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
bash .dev/before_site.sh || { echo install fails; exit 1; }
export PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton
R=$OUT/r; mkdir -p $R; ROOT=$PWD
shape=${SHAPE:-qwen3_5-9b}; streams=${STREAMS:-1,32}
for round in 1 2; do
  for side in before after; do
    site=/tmp/site; [ $side = before ] && site=/tmp/bsite; [ $side = after ] && [ -d /tmp/asite ] && site=/tmp/asite
    [ $(el) -lt 480 ] || break
    PYTHONPATH=$site timeout 150 python -m tfd bench --shape $shape --streams $streams --prompt 1024 --new 256 \
      --out $R/$side-$round > $R/$side-$round.txt 2>&1
    echo "$side round $round rc=$? t=$(el)"; grep -a "$shape\|rror" $R/$side-$round.txt | cut -c1-200
    if [ $round = 1 ]; then
      for n in ${streams//,/ }; do
        PYTHONPATH=$site timeout 100 python .dev/tokens_sha.py $shape $n >> $R/$side-tokens.jsonl 2>> $R/$side-tokens.err
      done
      cat $R/$side-tokens.jsonl
    fi
  done
done
cd $OUT && tar czf r.tgz r && rm -rf r

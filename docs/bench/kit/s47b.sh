#!/usr/bin/env bash
# For the forty-fifth session, any card (~330 s): the GPU tests of what the forty-fourth session built without a
# device (the pool's gathered page-table writes, HostStaging.write_many; the prompt lanes made after the first
# projection; Flash Next's 24/2-head prefill tiles) with DENSE_PREFIX on (constants.py), then Flash Next's one
# stream with and without it (prefill and step, two rounds). Carry .whl .whl-test .devk .devcache.
. .dev/start.sh
export PYTHONPATH=$PYTHONPATH:$PWD/.dev SET=tfd.model.attention.DENSE_PREFIX=1
gpu_tests 230 8 -rE -p constants tests/pool/test_staging.py tests/kernels/test_paged_attention.py \
  tests/engine/test_device_path.py -k "staging or prefill or qwen4_exp"
grep -a "^ERROR\|^FAILED\|^E  " $R/gpu-tests.txt | cut -c1-200 | head -8
unset SET
timeout $(( 330 - $(el) )) tfd bench --shape qwen3_8-flash-next --streams 1 --prompt 1024 --new 64 --rounds 2 \
  --variant base= --variant dense=tfd.model.attention.DENSE_PREFIX=1 --out $R/fn > $R/fn.txt 2>&1
echo "fn rc=$? t=$(el)"; grep -a "x1:\|rror" $R/fn.txt | cut -c1-300
cd $OUT && tar czf r.tgz r && rm -rf r

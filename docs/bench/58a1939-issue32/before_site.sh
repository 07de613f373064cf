#!/usr/bin/env bash
# The tree before issue 32's redesign (937d261, from .dev/before.tgz) installed beside the working tree's:
# /tmp/site (install.sh: the carried wheels and the working tree) and /tmp/bsite (the same wheels, the
# before tree, the working tree's assets); with .dev/after.tgz, /tmp/asite the same for the tree that
# closed issue 32 (0116906), so later issues' changes stay out of its comparison. Make them with:
#   git archive 937d261 tfd kernels env ':!tfd/assets' | gzip > .dev/before.tgz
#   git archive 0116906 tfd kernels env ':!tfd/assets' | gzip > .dev/after.tgz
set -e
bash .dev/install.sh
rm -rf /tmp/before && mkdir -p /tmp/before && tar xzf .dev/before.tgz -C /tmp/before
mkdir -p /tmp/bsite && cp -r /tmp/site/. /tmp/bsite/ && rm -rf /tmp/bsite/tfd /tmp/bsite/tfd_kernels
cp -r /tmp/before/tfd /tmp/bsite/tfd && cp -r /tmp/before/kernels /tmp/bsite/tfd_kernels
cp -r tfd/assets/. /tmp/bsite/tfd/assets/ && rm -rf /tmp/bsite/tfd/_env && cp -r /tmp/before/env /tmp/bsite/tfd/_env
if [ -f .dev/after.tgz ]; then
  rm -rf /tmp/after && mkdir -p /tmp/after && tar xzf .dev/after.tgz -C /tmp/after
  mkdir -p /tmp/asite && cp -r /tmp/site/. /tmp/asite/ && rm -rf /tmp/asite/tfd /tmp/asite/tfd_kernels
  cp -r /tmp/after/tfd /tmp/asite/tfd && cp -r /tmp/after/kernels /tmp/asite/tfd_kernels
  cp -r tfd/assets/. /tmp/asite/tfd/assets/ && rm -rf /tmp/asite/tfd/_env && cp -r /tmp/after/env /tmp/asite/tfd/_env
fi

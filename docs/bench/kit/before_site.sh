#!/usr/bin/env bash
# The tree before issue 32's redesign (937d261, from .dev/before.tgz) installed beside the working tree's:
# /tmp/site (install.sh: the carried wheels and the working tree) and /tmp/bsite (the same wheels, the
# before tree, the working tree's assets). Make .dev/before.tgz with:
#   git archive 937d261 tfd kernels env ':!tfd/assets' | gzip > .dev/before.tgz
set -e
bash .dev/install.sh
rm -rf /tmp/before && mkdir -p /tmp/before && tar xzf .dev/before.tgz -C /tmp/before
mkdir -p /tmp/bsite && cp -r /tmp/site/. /tmp/bsite/ && rm -rf /tmp/bsite/tfd /tmp/bsite/tfd_kernels
cp -r /tmp/before/tfd /tmp/bsite/tfd && cp -r /tmp/before/kernels /tmp/bsite/tfd_kernels
cp -r tfd/assets/. /tmp/bsite/tfd/assets/ && rm -rf /tmp/bsite/tfd/_env && cp -r /tmp/before/env /tmp/bsite/tfd/_env

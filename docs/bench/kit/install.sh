#!/usr/bin/env bash
# Installs the carried wheels and tfd from the working tree (as its wheel maps it: kernels/ -> tfd_kernels,
# env/ -> tfd._env) into /tmp/site: the tfd wheel holds the 19 MB demo again and would pass the carry limit.
set -e
python -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl ${1:+$1/*.whl} > /dev/null 2>&1
mkdir -p /tmp/site; rm -rf /tmp/site/tfd /tmp/site/tfd_kernels; cp -r tfd /tmp/site/tfd; cp -r kernels /tmp/site/tfd_kernels
rm -rf /tmp/site/tfd/_env; cp -r env /tmp/site/tfd/_env
mkdir -p /tmp/site/bin; printf '#!/usr/bin/env python\nimport sys\nfrom tfd.cli import main\nsys.exit(main())\n' > /tmp/site/bin/tfd
chmod +x /tmp/site/bin/tfd

"""`python .dev/parts_moved.py LOG...`: the parts of the identity probe's state (probe_parts_serve.py's
"probe part NAME DIGEST" lines) whose digest is not the same in every log given."""
import collections
import re
import sys

seen = collections.defaultdict(set)
for path in sorted(sys.argv[1:]):
    for name, digest in re.findall(r"probe part (.+) ([0-9a-f]{12})$", open(path).read(), re.M):
        seen[name].add(digest)
moved = [name for name, digests in seen.items() if len(digests) > 1]
print(f"parts that moved: {len(moved)} of {len(seen)}: {moved[:40]}")

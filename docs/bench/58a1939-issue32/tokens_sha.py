"""The tokens of a bench workload, hashed, with the tree on PYTHONPATH (before and after a redesign).

Usage: python tokens_sha.py SHAPE STREAMS [PROMPT NEW]. Prints one JSON line: the shape, streams and
the sha256 of every stream's tokens (the same seed and workload as `tfd bench`'s first round).
"""

import hashlib
import json
import sys

import torch

from tfd.bench.main import random_model
from tfd.bench.workload import Workload, run

shape, streams = sys.argv[1], int(sys.argv[2])
prompt, new = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (1024, 256)
model, _ = random_model(shape, torch.device("cuda"))
timings = run(model, Workload(streams, prompt, new, 32768), graphs=True)
digest = hashlib.sha256(json.dumps([list(t) for t in timings.tokens]).encode()).hexdigest()
print(json.dumps({"shape": shape, "streams": streams, "tokens_sha": digest,
                  "step_ms": 1e3 * timings.decode_s / max(timings.decode_steps, 1)}))

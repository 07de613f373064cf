"""Issue 31 point 2: which decode-graph bucket breaks Flash Next at 32 streams.

    python3 .dev31/check2.py MODE LAYERS STREAMS[,STREAMS...] [BUCKETS]

MODE graphs | nopdl | eager (no graphs, no checks); BUCKETS a comma list replacing the graph
buckets (each run's max lanes is added as always). Each streams count runs 1,024-token prompts and
2 new tokens at 8,192-row steps after the one before, in one process.
"""

from __future__ import annotations

import os
import sys
import time
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if "tfd_kernels" not in sys.modules:
    package = types.ModuleType("tfd_kernels")
    package.__path__ = [str(ROOT / "kernels")]
    sys.modules["tfd_kernels"] = package

import tfd.engine.graphs as graphs  # noqa: E402
from tfd.bench.workload import Workload, run  # noqa: E402
from tfd.families.hybrid import HybridModel  # noqa: E402
from tfd.shapes import _layers, fit, weight_budget  # noqa: E402
from tfd_kernels import pdl  # noqa: E402


def main() -> None:
    mode, layers, streams = sys.argv[1], int(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")]
    if len(sys.argv) > 4:
        graphs.BUCKETS = tuple(int(b) for b in sys.argv[4].split(","))
    device = torch.device("cuda")
    shape = fit("qwen3_8-flash-next", weight_budget(device))
    config = {**shape.config, **_layers(layers)}
    model = HybridModel.random(shape.family, config, 0, torch.bfloat16, device)
    pdl.ENABLED = mode != "nopdl"
    print(f"mode {mode} layers {layers} buckets {graphs.BUCKETS}", flush=True)
    for count in streams:
        t = time.perf_counter()
        print(f"== {count} streams: buckets {graphs.buckets_for(count)}", flush=True)
        run(model, Workload(count, int(os.environ.get("PROMPT", "1024")), 2, 8192), graphs=mode != "eager")
        torch.cuda.synchronize()
        print(f"== {count} streams ran to the end in {time.perf_counter() - t:.1f} s", flush=True)


if __name__ == "__main__":
    main()

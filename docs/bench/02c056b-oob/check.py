"""Issue 31 point 2 on the H200: which launch leaves its table at 32 Flash Next streams.

Run from the repository root (no install needed; trio is not imported):

    CUDA_LAUNCH_BLOCKING=1 PYTHONUNBUFFERED=1 python3 .dev31/check.py eager  # no graphs, gathers checked
    CUDA_LAUNCH_BLOCKING=1 PYTHONUNBUFFERED=1 python3 .dev31/check.py graphs  # decode graphs on, as the bench
    CUDA_LAUNCH_BLOCKING=1 PYTHONUNBUFFERED=1 python3 .dev31/check.py nopdl   # graphs on, PDL off

Optional second argument: layers to keep (default 16, the bench's cut; 4 is much quicker). Each
step's plan is printed before it runs; every integer-tensor gather (``x[idx]``, ``gather``,
``index_select``) on CUDA outside a graph capture is synchronised and its index range checked on
the host, and the first bad one is printed with its Python stack and the step, then the run stops.
With CUDA_LAUNCH_BLOCKING=1 a fault inside a graph replay or a Triton kernel surfaces at that launch.
Read: a 'BAD INDEX' line names the culprit; a crash only in 'graphs' points into the captured step;
a crash that 'nopdl' does not reproduce points at a dependent-launch ordering bug.
"""

from __future__ import annotations

import os
import sys
import traceback
import types
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if "tfd_kernels" not in sys.modules:  # the kernels/ folder under the name an install gives it
    package = types.ModuleType("tfd_kernels")
    package.__path__ = [str(ROOT / "kernels")]
    sys.modules["tfd_kernels"] = package

from tfd.bench.workload import Workload, run  # noqa: E402
from tfd.engine.runner import Runner  # noqa: E402
from tfd.families.hybrid import HybridModel  # noqa: E402
from tfd.shapes import _layers, fit, weight_budget  # noqa: E402
from tfd_kernels import pdl  # noqa: E402

STEP = [0]


def _index_of(func: object, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """(source, index, dim) of a single-index gather, else None."""
    if func is torch.Tensor.__getitem__:
        source, key = args[0], args[1]
        keys = key if isinstance(key, tuple) else (key,)
        tensors = [k for k in keys if isinstance(k, torch.Tensor) and not k.is_floating_point()]
        if len(tensors) == 1 and keys[0] is tensors[0] and tensors[0].dtype != torch.bool:
            return source, tensors[0], 0
    if func in (torch.gather, torch.Tensor.gather, torch.index_select, torch.Tensor.index_select):
        dim = args[1] if len(args) > 1 else kwargs["dim"]
        index = args[2] if len(args) > 2 else kwargs["index"]
        return args[0], index, dim
    return None


class CheckedGathers(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        found = _index_of(func, args, kwargs)
        if found is not None and found[1].is_cuda and not torch.cuda.is_current_stream_capturing():
            source, index, dim = found
            torch.cuda.synchronize()
            if index.numel():
                low, high, size = int(index.min()), int(index.max()), source.shape[dim]
                if low < -size or high >= size:
                    print(f"BAD INDEX at step {STEP[0]}: {func.__name__} of {list(source.shape)} "
                          f"{source.dtype} dim {dim}: index {list(index.shape)} in [{low}, {high}], "
                          f"size {size}", flush=True)
                    traceback.print_stack(limit=12)
                    sys.exit(3)
        return func(*args, **(kwargs or {}))


def traced(method):  # type: ignore[no-untyped-def]
    def wrapper(self, works):  # type: ignore[no-untyped-def]
        STEP[0] += 1
        parts = [f"{'d' if w.decode else 'p'}{w.lane.number}@{w.start}+{w.length}" for w in works]
        print(f"step {STEP[0]}: {len(works)} works: {' '.join(parts)}", flush=True)
        return method(self, works)
    return wrapper


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "eager"
    device = torch.device("cuda")
    shape = fit("qwen3_8-flash-next", weight_budget(device))
    config = shape.config if len(sys.argv) < 3 else {**shape.config, **_layers(int(sys.argv[2]))}
    print(shape.cut, "layers", config["num_hidden_layers"], "mode", mode, flush=True)
    model = HybridModel.random(shape.family, config, 0, torch.bfloat16, device)
    pdl.ENABLED = mode != "nopdl"
    Runner.run = traced(Runner.run)  # type: ignore[method-assign]
    for streams, new in ((8, 8), (32, 2), (32, 8)):  # the bench runs a warm-up of 2 tokens first
        STEP[0] = 0
        print(f"== {streams} streams, {new} new tokens", flush=True)
        workload = Workload(streams, 1024, new, int(os.environ.get("CHECK_STEP", "8192")))
        if mode == "eager":
            with CheckedGathers():
                run(model, workload, graphs=False)
        else:
            run(model, workload, graphs=True)
        torch.cuda.synchronize()
        print(f"== {streams} streams ran to the end", flush=True)


if __name__ == "__main__":
    main()

"""Issue 31: the host's side of a prefill step on the device, by cProfile (prefill_gaps.py found the 35B-A3B's
8 x 1,024 prefill step leaving the H100 idle ~27 ms of ~160, most of it between the state fills of admission
and before the step's input copies). One warm run, then one profiled: tfd's functions by cumulative and by own
time (cProfile slows Python about twice over; the device's wait shows as the step's one copy to the host).

    PYTHONPATH=/tmp/site python .dev/prefill_host.py SHAPE STREAMS PROMPT

With PASS_ONLY=1 only the prompt pass's forward is profiled (``HybridModel.forward`` over spans; the run's
decode graphs' capture left out, whose launches the whole run's profile counted with the pass's), and the
Triton launches made inside it are counted by kernel (torch's ops are in the tables as builtins).
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
from collections import Counter

import torch

from tfd.bench.main import random_model
from tfd.bench.workload import Workload, run
from tfd.families.hybrid import HybridModel


def pass_only(profiler: cProfile.Profile, launches: Counter[str]) -> None:
    """Profile ``HybridModel.forward`` alone, and count the Triton launches made inside it by kernel."""
    import triton.runtime.jit as jit

    forward, launch = HybridModel.forward, jit.JITFunction.run
    inside = [False]

    def profiled(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        inside[0] = True
        profiler.enable()
        try:
            return forward(self, *args, **kwargs)
        finally:
            profiler.disable()
            inside[0] = False

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if inside[0]:
            launches[self.fn.__name__] += 1
        return launch(self, *args, **kwargs)

    HybridModel.forward = profiled  # type: ignore[method-assign]
    jit.JITFunction.run = counted  # type: ignore[method-assign]


def main() -> None:
    shape, streams, prompt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    model, _ = random_model(shape, torch.device("cuda"))
    workload = Workload(streams, prompt, 1)
    run(model, workload, True, seed=2)
    profiler = cProfile.Profile()
    launches: Counter[str] = Counter()
    alone = os.environ.get("PASS_ONLY") == "1"
    if alone:
        pass_only(profiler, launches)
    else:
        profiler.enable()
    timings = run(model, workload, True, seed=2)
    torch.cuda.synchronize()
    profiler.disable()
    if alone:
        print(f"Triton launches in the prompt pass: {sum(launches.values())}: "
              + ", ".join(f"{name} {count}" for name, count in launches.most_common()))
    print(f"{shape} {streams} x {prompt}: prefill {timings.prefill_s * 1e3:.1f} ms under cProfile",
          flush=True)
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = [(cumulative, own, calls, f"{path.split('/site/')[-1]}:{line} {name}")
            for (path, line, name), (_, calls, own, cumulative, _) in stats.items()]
    for title, key in (("cumulative", 0), ("own", 1)):
        print(f"by {title} ms (cumulative, own, calls):")
        for row in sorted(rows, key=lambda r: -r[key])[:45 if key == 0 else 30]:
            print(f"  {row[0] * 1e3:9.2f} {row[1] * 1e3:9.2f} {row[2]:7d}  {row[3][:150]}")


if __name__ == "__main__":
    main()

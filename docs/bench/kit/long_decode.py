"""Issue 31: what a Flash Next decode step at a long context spends beyond one at 1,024 tokens (the bar: one
stream's decode at a 32,768-token prompt >= 85% of its 1,024-token tok/s; the forty-first session measured
3.07 against 2.60 ms a step). For each prompt length, two profiled runs of one stream, NEW_SHORT and NEW_LONG
new tokens, after a warm one; each kernel's device time in the longer run less the shorter, over the steps
between them, is its time a decode step at that context; printed side by side, the largest growth first.

    PYTHONPATH=/tmp/site python .dev/long_decode.py [SHAPE] [PROMPTS]   (qwen3_8-flash-next 1024,32768)
"""

from __future__ import annotations

import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from tfd.bench.main import random_model
from tfd.bench.workload import Workload, run

NEW_SHORT, NEW_LONG = 4, 36


def kernel_us(model, prompt: int, new: int) -> dict[str, tuple[float, int]]:  # type: ignore[no-untyped-def]
    """Each device kernel's total time (us) and calls in one profiled run of one stream."""
    with profile(activities=[ProfilerActivity.CUDA]) as profiled:
        run(model, Workload(1, prompt, new), True, seed=2)
        torch.cuda.synchronize()
    found: dict[str, tuple[float, int]] = {}
    for event in profiled.key_averages():
        if event.self_device_time_total > 0:  # kernels and copies (the ops that launch them: none of their own)
            found[event.key] = (event.self_device_time_total, event.count)
    return found


def main() -> None:
    shape = sys.argv[1] if len(sys.argv) > 1 else "qwen3_8-flash-next"
    prompts = [int(p) for p in (sys.argv[2] if len(sys.argv) > 2 else "1024,32768").split(",")]
    model, _ = random_model(shape, torch.device("cuda"))
    steps = NEW_LONG - NEW_SHORT
    per_step: dict[int, dict[str, float]] = {}
    for prompt in prompts:
        run(model, Workload(1, prompt, NEW_SHORT), True, seed=2)  # compiles and captures outside the profile
        short, long = kernel_us(model, prompt, NEW_SHORT), kernel_us(model, prompt, NEW_LONG)
        table: dict[str, float] = defaultdict(float)
        for name, (total, _) in long.items():
            table[name] = (total - short.get(name, (0.0, 0))[0]) / steps
        per_step[prompt] = table
        print(f"prompt {prompt}: {sum(table.values()):.1f} us of kernels a decode step", flush=True)
    names = set().union(*per_step.values())
    first, last = prompts[0], prompts[-1]
    rows = sorted(names, key=lambda n: -(per_step[last].get(n, 0.0) - per_step[first].get(n, 0.0)))
    print(f"{'kernel':<60} " + " ".join(f"{p:>10}" for p in prompts) + "   growth (us a step)")
    for name in rows[:30]:
        values = [per_step[p].get(name, 0.0) for p in prompts]
        print(f"{name[:60]:<60} " + " ".join(f"{v:>10.1f}" for v in values) + f"   {values[-1] - values[0]:+.1f}")


if __name__ == "__main__":
    main()

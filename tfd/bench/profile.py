"""``tfd bench --profile``: where a workload's time goes, kernel by kernel, by torch's profiler.

Two short runs a workload, each profiled alone after an unprofiled run of the same (which compiles
its kernels, so no compile lands in the profile): its prompts with one new token each (the prefill),
and 16-token prompts with 33 new tokens each at the same concurrency (the decode steps). Each gives
a table of the device kernels (host ops on a CPU) by their own time, with the run's step count, so a
kernel's time a step is its total over the steps. On a GPU a second table splits the same kernels by
their launch grid, which tells apart the launches of one kernel on different shapes (the products of
every weight are one Triton kernel; its grid is [column tiles, row tiles, K segments]), with each
kernel's own share of the timeline (from the end of the kernels before it to its end), which adds up
to the run's device time however launches overlap, then the device's idle time inside the engine
steps (``tfd.bench.idle``: before a step's first launch, after its last, in gaps between launches, by
the kernels either side); a third lists the host's operations by their own time (where a step whose
kernels leave the device idle spends it). A profiled run is slower than the timed one.
"""

from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import attrs
import torch
from torch.profiler import ProfilerActivity, profile

from tfd.bench.idle import idle_report
from tfd.bench.workload import Workload, run
from tfd.families.hybrid import HybridModel
from tfd_kernels import pdl

ROWS = 40  # kernels a table shows
HOST_ROWS = 15  # host operations the third table shows
IDLE_ROWS = 8  # kinds of idle gaps the idle report shows
DECODE_PROMPT, DECODE_NEW = 16, 33


def kernel_table(model: HybridModel, workload: Workload, graphs: bool) -> str:
    """The profile of one run of ``workload``: a line of its timings, then the table."""
    device = model.weights.embed.device
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    enabled, pdl.ENABLED = pdl.ENABLED, False  # the run builds its own graphs, so they launch plainly
    try:
        run(model, workload, graphs, seed=2)  # compiled and captured before the profile starts
        with profile(activities=activities) as profiled:
            timings = run(model, workload, graphs, seed=2)
            if cuda:
                torch.cuda.synchronize(device)
    finally:
        pdl.ENABLED = enabled
    head = (f"{workload.streams} streams x {workload.prompt_tokens} prompt tokens, "
            f"{workload.new_tokens} new: "
            f"prefill {timings.prefill_s * 1e3:.1f} ms, {workload.new_tokens - 1} decode steps "
            f"({timings.decode_steps} timed end to end in {timings.decode_s * 1e3:.1f} ms; profiled)\n")
    table: str = profiled.key_averages().table(
        sort_by="self_device_time_total" if cuda else "self_cpu_time_total", row_limit=ROWS)
    if cuda:
        with tempfile.TemporaryDirectory() as folder:
            trace = Path(folder) / "trace.json"
            profiled.export_chrome_trace(str(trace))
            events = json.loads(trace.read_text())
            table += "\n" + by_grid(events, ROWS) + "\n" + idle_report(events, IDLE_ROWS)
        table += "\n" + profiled.key_averages().table(sort_by="self_cpu_time_total", row_limit=HOST_ROWS)
    return head + table


def by_grid(trace: dict[str, Any], rows: int) -> str:
    """The device kernels of a Chrome trace (torch's profiler export) grouped by name and launch
    grid: calls, total and mean microseconds, and the mean of each call's own time (from the end of
    the kernels before it to its end: kernels that overlap share the timeline rather than count it
    twice, and the gap a kernel waited out is its), the most own time first, ``rows`` lines at most."""
    kernels = sorted((event for event in trace.get("traceEvents", [])
                      if event.get("cat") == "kernel" and event.get("ph") == "X"),
                     key=lambda event: float(event.get("ts", 0.0)))
    groups: dict[tuple[str, tuple[int, ...]], list[tuple[float, float]]] = defaultdict(list)
    reached: float | None = None  # the latest end of the kernels so far
    for event in kernels:
        duration = float(event.get("dur", 0.0))
        end = float(event.get("ts", 0.0)) + duration
        own = duration if reached is None else max(0.0, end - reached)
        reached = end if reached is None else max(reached, end)
        grid = tuple(event.get("args", {}).get("grid", ()))
        groups[(event["name"], grid)].append((duration, own))
    ranked = sorted(groups.items(), key=lambda item: -sum(own for _, own in item[1]))[:rows]
    lines = [f"{'kernel':<40} {'grid':<20} {'calls':>7} {'total us':>11} {'mean us':>9} {'own us':>9}"]
    for (name, grid), times in ranked:
        total = sum(duration for duration, _ in times)
        own = sum(own for _, own in times)
        lines.append(f"{name[:40]:<40} {list(grid)!s:<20} {len(times):>7} {total:>11.1f} "
                     f"{total / len(times):>9.2f} {own / len(times):>9.2f}")
    return "\n".join(lines) + "\n"


def profiles(model: HybridModel, workload: Workload, graphs: bool) -> dict[str, str]:
    """``{"prefill": table, "decode": table}`` for ``workload``'s two phases."""
    prefill = attrs.evolve(workload, new_tokens=1)
    decode = attrs.evolve(workload, prompt_tokens=DECODE_PROMPT, new_tokens=DECODE_NEW)  # drafts, text alike
    return {"prefill": kernel_table(model, prefill, graphs), "decode": kernel_table(model, decode, graphs)}

"""``tfd bench --profile``'s account of the device's idle time inside engine steps.

The bench marks each engine step it drives (``STEP``, a ``record_function`` range). From a Chrome
trace of a profiled run (torch's profiler export) this sums, over the marked steps, the device's busy
time (kernels, copies, fills) against the steps' length, and splits the idle time: before a step's
first launch ran (the host's work at the step's start: admissions, inputs), after its last (the wait
for the draw), and in gaps of ``GAP_US`` or more between launches, the largest of those summed by the
kernels either side. Launches closer than ``GAP_US`` are the device's own spacing, not waiting. On the
H100 this found the 35B-A3B's 8 x 1,024 prefill step idle ~16 ms of ~160 while its lanes opened
(docs/bench.md, 2026-12-06).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

STEP = "tfd.step"  # the range the bench's driver opens around each engine step
GAP_US = 20.0
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def idle_report(trace: dict[str, Any], rows: int) -> str:
    """Lines on the marked steps' device time and idle time, the ``rows`` largest gap kinds after;
    empty when the trace holds no marked step with device work in it."""
    events = [event for event in trace.get("traceEvents", []) if event.get("ph") == "X"]
    steps = sorted((_start(e), _end(e)) for e in events
                   if e.get("name") == STEP and e.get("cat") == "user_annotation")
    device = sorted((_start(e), _end(e), str(e.get("name", "")))
                    for e in events if e.get("cat") in DEVICE_CATS)
    span = busy = before = after = 0.0
    gaps: dict[str, list[float]] = defaultdict(list)
    counted = 0
    for begin, end in steps:
        inside = [launch for launch in device if begin <= launch[0] <= end]
        if not inside:
            continue
        counted += 1
        span += end - begin
        before += inside[0][0] - begin
        reached, name = inside[0][1], inside[0][2]
        busy += reached - inside[0][0]
        for start, stop, following in inside[1:]:
            if start - reached >= GAP_US:
                gaps[f"{name[:32]} -> {following[:32]}"].append(start - reached)
            busy += max(0.0, stop - max(start, reached))  # launches that overlap count once
            if stop > reached:
                reached, name = stop, following
        after += max(0.0, end - reached)
    if not counted:
        return ""
    between = sum(sum(found) for found in gaps.values())
    lines = [f"steps {counted}: {span / 1e3:.2f} ms, the device busy {busy / 1e3:.2f} ms; idle before each "
             f"step's first launch {before / 1e3:.2f} ms, after its last {after / 1e3:.2f} ms, in "
             f"{sum(map(len, gaps.values()))} gaps of {GAP_US:.0f} us or more between launches "
             f"{between / 1e3:.2f} ms"]
    for pair, found in sorted(gaps.items(), key=lambda item: -sum(item[1]))[:rows]:
        lines.append(f"  {sum(found) / 1e3:8.3f} ms {len(found):5d} x  {pair}")
    return "\n".join(lines) + "\n"


def _start(event: dict[str, Any]) -> float:
    return float(event["ts"])


def _end(event: dict[str, Any]) -> float:
    return float(event["ts"]) + float(event.get("dur", 0.0))

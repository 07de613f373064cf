"""Issue 31: where a prefill step leaves the device idle. The 35B-A3B's 8 x 1,024 prefill took 149.5 ms on the
H100 (591dc39) with 130.9 ms of kernels in it; Flash Next's 1 x 1,024 36.8 ms with 26.4. Two profiled runs
of the workload (one new token), each engine step marked (a ``record_function`` around ``Stepper.step``):

- without Python stacks (the host at its own speed): the prompts' step (the longest), its device busy and
  idle time, the idle before its first kernel and after its last, its idle gaps summed by the kernels on
  either side, and the host's runtime and driver calls over 50 us in it;
- with Python stacks: those long host calls again, each with the tfd frames it was made from.

    PYTHONPATH=/tmp/site python .dev/prefill_gaps.py SHAPE STREAMS PROMPT [OUT_DIR]
    (GAPS_STACKS=0: the run without stacks alone)
"""

from __future__ import annotations

import bisect
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from tfd.bench.main import random_model
from tfd.bench.workload import Workload, run
from tfd.engine import stepper

GAP_US = 20.0  # idle stretches shorter than this are launch spacing, not waits
LONG_US = 50.0  # host calls at least this long are listed
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATS = ("cuda_runtime", "cuda_driver")
MARK = "tfd.step"


def marked_steps() -> None:
    """Every ``Stepper.step`` inside a ``MARK`` range, so a trace shows where each step begins and ends."""
    plain = stepper.Stepper.step

    def step(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        with record_function(MARK):
            return plain(self, *args, **kwargs)
    stepper.Stepper.step = step  # type: ignore[method-assign]


def traced(model, workload: Workload, stack: bool, path: Path) -> list[dict]:  # type: ignore[no-untyped-def]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=stack) as profiled:
        run(model, workload, True, seed=2)
        torch.cuda.synchronize()
    profiled.export_chrome_trace(str(path))
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    path.unlink()  # hundreds of MB with stacks: the lines printed are what comes back
    for event in events:
        event["ts"], event["dur"] = float(event["ts"]), float(event.get("dur", 0.0))
    return events


def prompts_step(events: list[dict]) -> tuple[float, float]:
    marks = [e for e in events if e.get("name") == MARK and e.get("cat") == "user_annotation"]
    step = max(marks, key=lambda e: e["dur"])
    return step["ts"], step["ts"] + step["dur"]


def step_device(events: list[dict]) -> list[dict]:
    """The prompts' step's device events, by start."""
    begin, end = prompts_step(events)
    return sorted((e for e in events if e.get("cat") in DEVICE_CATS and begin <= e["ts"] <= end),
                  key=lambda e: e["ts"])


def idle_gaps(device: list[dict]) -> list[tuple[float, dict, dict]]:
    """(us, the event the device ran last before, the event after) of each idle stretch over ``GAP_US``."""
    gaps = []
    reached, before = device[0]["ts"] + device[0]["dur"], device[0]
    for event in device[1:]:
        if event["ts"] - reached > GAP_US:
            gaps.append((event["ts"] - reached, before, event))
        if event["ts"] + event["dur"] > reached:
            reached, before = event["ts"] + event["dur"], event
    return gaps


def idle(events: list[dict]) -> None:
    begin, end = prompts_step(events)
    device = step_device(events)
    busy = sum(e["dur"] for e in device)
    last = max(e["ts"] + e["dur"] for e in device)
    print(f"step {(end - begin) / 1e3:.2f} ms; device busy {busy / 1e3:.2f} ms in {len(device)} launches; "
          f"idle before the first {(device[0]['ts'] - begin) / 1e3:.2f} ms, after the last "
          f"{(end - last) / 1e3:.2f} ms", flush=True)
    pairs: dict[str, list[float]] = defaultdict(list)
    for gap, before, after in idle_gaps(device):
        pairs[f"{before['name'][:28]} -> {after['name'][:28]}"].append(gap)
    total = sum(sum(gaps) for gaps in pairs.values())
    print(f"idle gaps over {GAP_US:.0f} us between kernels: {sum(map(len, pairs.values()))}, "
          f"{total / 1e3:.2f} ms; by the kernels either side:")
    for pair, gaps in sorted(pairs.items(), key=lambda item: -sum(item[1]))[:14]:
        print(f"  {sum(gaps) / 1e3:7.2f} ms {len(gaps):4d} x  {pair}")
    host = sorted((e for e in events if e.get("cat") in HOST_CATS and begin <= e["ts"] <= end
                   and e["dur"] >= LONG_US), key=lambda e: e["ts"])
    summed: dict[str, list[float]] = defaultdict(list)
    for call in host:
        summed[call["name"]].append(call["dur"])
    print("host calls over 50 us: " + "; ".join(f"{name} {len(d)} x {sum(d) / 1e3:.2f} ms"
                                                for name, d in summed.items()), flush=True)


def frames_at(python: list[dict], starts: list[float], tid: object, at: float) -> list[str]:
    """The tfd frames (innermost last) of thread ``tid`` at time ``at``."""
    found = []
    for event in python[:bisect.bisect_right(starts, at)]:
        inside = event["ts"] <= at <= event["ts"] + event["dur"]
        if event["tid"] == tid and inside and "tfd" in event["name"]:
            found.append(event["name"].split("/site/")[-1])
    return found


def long_calls(events: list[dict]) -> None:
    begin, end = prompts_step(events)
    python = sorted((e for e in events if e.get("cat") == "python_function"
                     and e["ts"] <= end and e["ts"] + e["dur"] >= begin), key=lambda e: e["ts"])
    starts = [e["ts"] for e in python]
    host = [e for e in events
            if e.get("cat") in HOST_CATS and begin <= e["ts"] <= end and e["dur"] >= LONG_US]
    places: dict[str, list[float]] = defaultdict(list)
    for call in host:
        frames = frames_at(python, starts, call["tid"], call["ts"])
        places[f"{call['name']} @ {' > '.join(frames[-3:]) or '?'}"].append(call["dur"])
    print("with stacks, host calls over 50 us by place:")
    for place, durations in sorted(places.items(), key=lambda item: -sum(item[1]))[:16]:
        print(f"  {sum(durations) / 1e3:7.2f} ms {len(durations):4d} x  {place}")


def startup_tree(events: list[dict]) -> None:
    """The Python calls from the prompts' step's start to the launch of its first kernel of over 100 us
    (the device idle but for small launches meanwhile): a tree to depth 6 under the step, calls of 300 us
    or more."""
    begin, end = prompts_step(events)
    kernels = [e for e in events if e.get("cat") == "kernel" and begin <= e["ts"] <= end and e["dur"] > 100.0]
    kernel = min(kernels, key=lambda e: e["ts"])
    launches = {e["args"].get("correlation"): e for e in events if e.get("cat") in HOST_CATS}
    launched = launches.get(kernel["args"].get("correlation"), kernel)["ts"]
    print(f"from the step's start to the launch of its first long kernel ({kernel['name'][:30]}): "
          f"{(launched - begin) / 1e3:.2f} ms; the device starts it {(kernel['ts'] - begin) / 1e3:.2f} ms in")
    python = sorted((e for e in events if e.get("cat") == "python_function" and e["ts"] <= launched
                     and e["ts"] + e["dur"] >= begin), key=lambda e: (e["ts"], -e["dur"]))
    open_ends: list[float] = []
    base = None
    for event in python:
        while open_ends and open_ends[-1] <= event["ts"]:
            open_ends.pop()
        depth = len(open_ends)
        open_ends.append(event["ts"] + event["dur"])
        if base is None:
            if "stepper.py" in event["name"] and event["name"].endswith(": step"):
                base = depth
            continue
        if event["ts"] >= begin and event["dur"] >= 300.0 and base < depth <= base + 6:
            name = event["name"].split("/site/")[-1]
            print(f"  {'  ' * (depth - base - 1)}{event['dur'] / 1e3:7.2f} ms  {name[:120]}")


TREE_US = 100.0  # host calls at least this long inside a gap's window are listed
TREE_LINES = 60


def gap_hosts(events: list[dict], count: int = 4) -> None:
    """The ``count`` longest idle gaps of the prompts' step, each with what the host did between the launch
    of the kernel before it and the launch of the kernel after it: the calls (Python frames with stacks,
    torch ops without) overlapping that window by ``TREE_US`` or more, nested, each with its time inside."""
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in HOST_CATS and "correlation" in e.get("args", {})}
    gaps = idle_gaps(step_device(events))
    calls = [e for e in events if e.get("cat") in ("python_function", "cpu_op", "user_annotation")]
    for gap, first, then in sorted(gaps, key=lambda g: -g[0])[:count]:
        a = launches.get(first.get("args", {}).get("correlation"))
        b = launches.get(then.get("args", {}).get("correlation"))
        if a is None or b is None:
            print(f"gap {gap / 1e3:.2f} ms: {first['name'][:40]} -> {then['name'][:40]}: launches not found")
            continue
        low, high = a["ts"] + a["dur"], b["ts"]
        print(f"gap {gap / 1e3:.2f} ms: {first['name'][:40]} -> {then['name'][:40]}; the host "
              f"{(high - low) / 1e3:.2f} ms from the one's launch to the other's ({b['name']}):")
        inside = []
        for e in calls:
            if e["tid"] != b["tid"]:
                continue
            overlap = min(e["ts"] + e["dur"], high) - max(e["ts"], low)
            if overlap >= TREE_US:
                inside.append((e, overlap))
        inside.sort(key=lambda item: (item[0]["ts"], -item[0]["dur"]))
        open_ends: list[float] = []
        printed = 0
        for e, overlap in inside:
            while open_ends and open_ends[-1] <= e["ts"]:
                open_ends.pop()
            depth = len(open_ends)
            open_ends.append(e["ts"] + e["dur"])
            if depth > 32 or printed == TREE_LINES:
                continue
            printed += 1
            name = e["name"].split("/site/")[-1]
            print(f"  {' ' * depth}{overlap / 1e3:6.2f} ms  {name[:110]}")


def main() -> None:
    shape, streams, prompt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    out = Path(sys.argv[4]) if len(sys.argv) > 4 else Path(".")
    marked_steps()
    model, _ = random_model(shape, torch.device("cuda"))
    workload = Workload(streams, prompt, 1)
    run(model, workload, True, seed=2)
    unprofiled = run(model, workload, True, seed=2).prefill_s
    print(f"{shape} {streams} x {prompt}: prefill {unprofiled * 1e3:.1f} ms unprofiled", flush=True)
    plain = traced(model, workload, False, out / "plain.json")
    idle(plain)
    gap_hosts(plain)
    if os.environ.get("GAPS_STACKS", "1") == "0":
        return
    stacked = traced(model, workload, True, out / "stacks.json")
    long_calls(stacked)
    gap_hosts(stacked)
    try:
        startup_tree(stacked)
    except Exception as error:  # the lines above are kept whatever this finds
        print(f"startup tree: {error!r}")


if __name__ == "__main__":
    main()

"""`tfd bench --profile`'s idle report: the device's busy and idle time inside the engine steps the
bench marks, from a profiler trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from tfd.bench.idle import GAP_US, STEP, idle_report
from tfd.bench.workload import marked


def event(cat: str, name: str, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {}}


def test_idle_time_is_split_before_after_and_between_launches_from_twenty_us() -> None:
    assert GAP_US == 20.0
    trace = {"traceEvents": [
        event("user_annotation", STEP, 0.0, 100.0),  # step one: launches from 10 to 90
        event("kernel", "_k1", 10.0, 20.0),
        event("kernel", "_k2", 35.0, 15.0),  # 5 us after _k1: the device's spacing, not a gap
        event("gpu_memcpy", "Memcpy HtoD", 80.0, 10.0),  # 30 us after _k2: a gap
        event("kernel", "_outside", 150.0, 10.0),  # in no step: not counted
        event("user_annotation", STEP, 200.0, 100.0),  # step two: launches from its start to 290
        event("kernel", "_k3", 200.0, 20.0),
        event("kernel", "_k4", 239.5, 10.5),  # 19.5 us after _k3: under the threshold
        event("kernel", "_k5", 270.0, 10.0),  # 20.0 us after _k4: at it, counted
        event("kernel", "_k6", 275.0, 15.0),  # overlaps _k5 (dependent launch): its 10 us past counted
        event("gpu_user_annotation", STEP, 200.0, 90.0),  # the device side's range: not a step
        event("cpu_op", "aten::add", 0.0, 300.0),
    ]}
    lines = idle_report(trace, rows=5).splitlines()
    assert lines[0] == ("steps 2: 0.20 ms, the device busy 0.10 ms; idle before each step's first "
                        "launch 0.01 ms, after its last 0.02 ms, in 2 gaps of 20 us or more between "
                        "launches 0.05 ms")
    assert lines[1].split() == ["0.030", "ms", "1", "x", "_k2", "->", "Memcpy", "HtoD"]
    assert lines[2].split() == ["0.020", "ms", "1", "x", "_k4", "->", "_k5"]
    assert len(lines) == 3
    assert idle_report(trace, rows=1).count("\n") == 2  # the largest gap kind alone


def test_a_trace_without_marked_steps_reports_nothing() -> None:
    assert idle_report({"traceEvents": [event("kernel", "_k1", 0.0, 5.0)]}, rows=5) == ""
    empty_step = [event("user_annotation", STEP, 0.0, 10.0), event("kernel", "_k1", 20.0, 5.0)]
    assert idle_report({"traceEvents": empty_step}, rows=5) == ""


def test_the_bench_marks_its_steps_only_while_profiling(tmp_path: Path) -> None:
    with marked():  # no profiler: nothing recorded, nothing to pay
        pass
    with profile(activities=[ProfilerActivity.CPU]) as profiled, marked():
        torch.ones(2).sum()
    profiled.export_chrome_trace(str(tmp_path / "trace.json"))
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert [e["cat"] for e in events if e.get("name") == STEP] == ["user_annotation"]

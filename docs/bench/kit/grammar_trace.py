"""Issue 33's demo half: where a grammar decode step's host time goes. ``tfd bench --profile`` with
Python stacks on, each profiled run's Chrome trace written to ``$TRACE_DIR/traceN.json`` (N in run
order: the prefill's, then the decode steps'), besides the bench's own tables.

    PYTHONPATH=/tmp/site TRACE_DIR=DIR python .dev/grammar_trace.py <tfd bench flags> --profile
"""
import os
import shutil
import sys

from torch.profiler import profile as plain

import tfd.bench.profile as bench_profile
from tfd.cli import main

folder = os.environ["TRACE_DIR"]
os.makedirs(folder, exist_ok=True)


class Traced(plain):
    def __init__(self, **options):
        super().__init__(with_stack=True, **options)

    def export_chrome_trace(self, path):  # the bench's own export, kept: a trace saves once
        out = super().export_chrome_trace(path)
        shutil.copy(path, os.path.join(folder, f"trace{len(os.listdir(folder))}.json"))
        return out


bench_profile.profile = Traced


def summary(path: str, rows: int = 45) -> None:
    """The trace's tfd (and llguidance) Python frames by their inclusive time summed, and the host's
    runtime calls of 30 us or more with the innermost tfd frames they were made from."""
    import json
    from collections import defaultdict
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    frames = [e for e in events if e.get("cat") == "python_function"]
    total: dict[str, list[float]] = defaultdict(list)
    for e in frames:
        if "tfd/" in e["name"] or "llguidance" in e["name"] or "torch/cuda" in e["name"]:
            total[e["name"]].append(float(e["dur"]))
    print(f"{path}: frames by inclusive time (us): total, calls, mean")
    for name, durs in sorted(total.items(), key=lambda kv: -sum(kv[1]))[:rows]:
        print(f"{sum(durs):10.0f} {len(durs):6d} {sum(durs) / len(durs):8.1f}  {name[-110:]}")
    by_tid: dict[object, list[dict]] = defaultdict(list)
    for e in frames:
        if "tfd/" in e["name"]:
            by_tid[e["tid"]].append(e)
    calls: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and float(e["dur"]) >= 30:
            start = float(e["ts"])
            inside = [f for f in by_tid.get(e["tid"], []) if float(f["ts"]) <= start <= float(f["ts"]) + float(f["dur"])]
            inside.sort(key=lambda f: float(f["ts"]))
            where = " < ".join(f["name"].split("/")[-1][:60] for f in inside[-3:][::-1])
            calls[f"{e['name']} @ {where}"].append(float(e["dur"]))
    print("runtime calls of 30 us or more: total us, calls, mean, where")
    for name, durs in sorted(calls.items(), key=lambda kv: -sum(kv[1]))[:25]:
        print(f"{sum(durs):10.0f} {len(durs):6d} {sum(durs) / len(durs):8.1f}  {name[:230]}")


sys.argv = ["tfd", "bench", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
for name in sorted(os.listdir(folder)):
    if name.endswith(".json"):
        summary(os.path.join(folder, name))

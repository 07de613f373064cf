"""Where a grammar decode step's time goes: host time of the step's parts and device time of the
forward and the masked draw, by CUDA events. ``python grammar_timeline.py <tfd bench flags>``: runs
``tfd bench`` with the engine's functions wrapped, then prints one JSON line of medians (us)."""
import collections, json, os, statistics, sys, time
import torch
from tfd.engine import decode_pipeline, drawn, grammar, grammar_masks, runner, sampling, stepper, lane, graphs

host = collections.defaultdict(list)
events = []  # (label, start event, end event)


def wrap(owner, name, label, static=False):
    orig = getattr(owner, name)
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            host[label].append((time.perf_counter() - t) * 1e6)
    setattr(owner, name, staticmethod(timed) if static else timed)


def on_device(owner, name, label):
    orig = getattr(owner, name)
    def timed(*a, **k):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = orig(*a, **k)
        end.record()
        events.append((label, start, end))
        return out
    setattr(owner, name, timed)


if torch.cuda.is_available():
    on_device(graphs.DecodeGraphs, "run", "dev_forward")
    on_device(decode_pipeline.DecodePipeline, "drawn_on_host", "dev_drawn_on_host")
wrap(grammar_masks, "allowed", "allowed")
wrap(grammar_masks, "_fill", "fill_work")
wrap(grammar_masks, "fill_ahead", "fill_ahead_start")
wrap(sampling.Rows, "of", "rows_of", static=True)
wrap(drawn, "sample", "sample_launch")
wrap(decode_pipeline, "host_draw", "host_draw")
wrap(decode_pipeline.DecodePipeline, "drawn_on_host", "drawn_on_host")
wrap(decode_pipeline.DecodePipeline, "go_on", "go_on")
wrap(decode_pipeline.Launched, "tokens", "wait_tokens")
wrap(runner.Runner, "run", "runner_run")
wrap(stepper.Stepper, "step", "stepper_step")
wrap(stepper.Stepper, "_take", "stepper_take")
wrap(grammar.Matcher, "take", "matcher_take")
wrap(lane.Lane, "take", "lane_take")
# the parts of go_on beside the wait for the masks (forty-ninth session: drawn_on_host took ~370 us past it)
wrap(decode_pipeline.DecodePipeline, "_following", "following")
wrap(decode_pipeline.DecodePipeline, "_launch", "launch")
wrap(decode_pipeline.DecodePipeline, "_copy_out", "copy_out")
wrap(runner.Runner, "drew", "runner_drew")
if torch.cuda.is_available():
    wrap(graphs.DecodeGraphs, "redraw", "redraw_launch")

from tfd.bench import workload  # noqa: E402
from tfd.cli import main  # noqa: E402

drive = workload.drive
def dumped(*a, **k):
    timings = drive(*a, **k)
    if os.environ.get("TOKENS_OUT"):  # each stream's tokens, for grammar_replay.py
        with open(os.environ["TOKENS_OUT"], "w") as out:
            json.dump([list(tokens) for tokens in timings.tokens], out)
    return timings
workload.drive = dumped

sys.argv = ["tfd", "bench", *sys.argv[1:]]
try:
    main()
    rc = 0
except SystemExit as stop:
    rc = stop.code
if torch.cuda.is_available():
    torch.cuda.synchronize()
out = {"rc": rc}
for label, values in host.items():
    tail = values[len(values) // 2:]  # the later half: past compiles and warm-up
    out[label] = {"calls": len(values), "median": round(statistics.median(tail), 1),
                  "mean": round(statistics.fmean(tail), 1)}
spans = collections.defaultdict(list)
for label, start, end in events[len(events) // 2:]:
    spans[label].append(start.elapsed_time(end) * 1e3)
for label, values in spans.items():
    out[label] = {"calls": len(values), "median": round(statistics.median(values), 1)}
# the device's gaps: from one forward's end to the next forward's start, minus the draw between
fw = [(s, e) for label, s, e in events if label == "dev_forward"]
gaps = [fw[i][1].elapsed_time(fw[i + 1][0]) * 1e3 for i in range(len(fw) // 2, len(fw) - 1)]
out["between_forwards"] = {"median": round(statistics.median(gaps), 1)} if gaps else None
print("TIMELINE " + json.dumps(out))

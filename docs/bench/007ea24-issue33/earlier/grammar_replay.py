"""Mask fills along real streams' tokens: ``python grammar_replay.py TOKENS.json [threads...]``
replays each step of 32 streams (the covering tokenizer at 248,320, the bench's records grammar)
and prints, for llguidance's executor at each thread count (0: its default), the fill's median and
mean over the steps (ms), and the serial sum of the lanes' fills alone."""
import json, os, statistics, sys, time
import llguidance
from tfd.shapes import covering_tokenizer
from tfd.bench.command import records_grammar
from tfd.engine.grammar import allowed

streams = json.load(open(sys.argv[1]))
counts = [int(x) for x in sys.argv[2:]] or [0]
vocab = 248320
g = records_grammar(covering_tokenizer(vocab), vocab, (0,), len(streams[0]))
try:
    quota = open("/sys/fs/cgroup/cpu.max").read().strip()
except OSError:
    quota = "?"
print(json.dumps({"cpu_count": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "cpu.max": quota}))
steps = min(len(s) for s in streams) - 1
for threads in counts:
    if threads:
        g.vocabulary.executor = llguidance.LLExecutor(threads)
    ms = [g.matcher() for _ in streams]
    batch, serial = [], []
    for k in range(steps):
        t = time.perf_counter(); allowed(len(ms), [(m, i, ()) for i, m in enumerate(ms)])
        batch.append((time.perf_counter() - t) * 1e3)
        if k % 4 == 0:
            t = time.perf_counter()
            for m in ms:
                allowed(1, [(m, 0, ())])
            serial.append((time.perf_counter() - t) * 1e3)
        for m, s in zip(ms, streams):
            m.take(s[k])
    print(json.dumps({"threads": threads, "steps": steps, "fill_median_ms": round(statistics.median(batch), 3),
                      "fill_mean_ms": round(statistics.fmean(batch), 3), "fill_max_ms": round(max(batch), 3),
                      "serial_mean_ms": round(statistics.fmean(serial), 3)}))

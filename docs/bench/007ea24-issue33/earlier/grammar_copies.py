"""Mask fills along real streams' tokens (``grammar_copies.py TOKENS.json [threads...]``): lanes whose
matchers are deep copies of one compiled start against lanes whose matchers are each compiled anew,
at each executor thread count; then the lanes' fills one at a time (ms a step, median and mean)."""
import json, statistics, sys, time
import llguidance
from tfd.shapes import covering_tokenizer
from tfd.bench.command import RECORD
from tfd.server.structured import json_rule
from tfd.engine.grammar import Vocabulary, allowed, Matcher
streams = json.load(open(sys.argv[1]))
vocab = 248320
v = Vocabulary(covering_tokenizer(vocab), vocab, (0,))
lark = f"start: {json_rule({'type': 'array', 'items': RECORD, 'minItems': 128})}\n"
g = v.compile(lark)
steps = min(len(s) for s in streams) - 1
def replay(make, threads, label):
    v.executor = llguidance.LLExecutor(threads)
    ms = make()
    batch = []
    for k in range(steps):
        t = time.perf_counter(); allowed(len(ms), [(m, i, ()) for i, m in enumerate(ms)]); batch.append((time.perf_counter() - t) * 1e3)
        for m, s in zip(ms, streams): m.take(s[k])
    print(label, threads, "median %.3f mean %.3f" % (statistics.median(batch), statistics.fmean(batch)))
copies = lambda: [g.matcher() for _ in streams]
grammar = llguidance.LLMatcher.grammar_from_lark(lark)
def fresh():
    t = time.perf_counter()
    out = [Matcher(v, llguidance.LLMatcher(v.tokenizer, grammar, log_level=0)) for _ in streams]
    print("fresh matchers", (time.perf_counter() - t) * 1e3, "ms")
    return out
for threads in [int(x) for x in sys.argv[2:]] or [1, 2]:
    replay(copies, threads, "deep copies")
    replay(fresh, threads, "fresh")
# serial, single-lane calls, without cache: fresh state each step (measure before the batch)
v.executor = llguidance.LLExecutor(1)
ms = copies(); serial = []
for k in range(steps):
    t = time.perf_counter()
    for m in ms: allowed(1, [(m, 0, ())])
    serial.append((time.perf_counter() - t) * 1e3)
    for m, s in zip(ms, streams): m.take(s[k])
print("serial singles median %.3f mean %.3f" % (statistics.median(serial), statistics.fmean(serial)))

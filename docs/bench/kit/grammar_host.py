"""The engine thread's host time of a grammar step's parts at 32 lanes, no model (any machine): each lane's
token judged on its mask's bit, ``fill_ahead`` (its making ready, the owed tokens stepped under OWED_FIRST,
the handoff), the lanes' takes, ``allowed``'s wait for the fill. ``python grammar_host.py [VOCAB]``; set a
grammar or grammar_masks constant for the A/B with GRAMMAR_SET=NAME=V[,...]. Prints one JSON line of medians (us)."""
import json, os, statistics, sys, time
import numpy as np
from tfd.bench.command import records_grammar
from tfd.engine import grammar, grammar_masks
from tfd.shapes import covering_tokenizer

for item in filter(None, os.environ.get("GRAMMAR_SET", "").split(",")):
    name, _, value = item.partition("=")
    module = grammar if hasattr(grammar, name) else grammar_masks
    setattr(module, name, type(getattr(module, name))(int(value)))
vocab = int(sys.argv[1]) if len(sys.argv) > 1 else 248320
lanes = 32
compiled = records_grammar(covering_tokenizer(vocab), vocab, (0,), 256)
matchers = [compiled.matcher() for _ in range(lanes)]
follows = [(matcher, row, ()) for row, matcher in enumerate(matchers)]
draw = np.random.default_rng(0)
masks = grammar_masks.allowed(lanes, follows)
parts: dict[str, list[float]] = {"judge": [], "fill_ahead": [], "takes": [], "allowed_wait": []}
for step in range(120):
    bits = np.unpackbits(masks.numpy().view(np.uint8), axis=1, bitorder="little")[:, :vocab]
    tokens = [int(draw.choice(np.flatnonzero(bits[row]))) for row in range(lanes)]
    t0 = time.perf_counter()
    judged = [matcher.judge(token) for matcher, token in zip(matchers, tokens)]
    t1 = time.perf_counter()
    grammar_masks.fill_ahead(lanes, follows)
    t2 = time.perf_counter()
    for matcher, token in zip(matchers, tokens):
        matcher.take(token)
    t3 = time.perf_counter()
    masks = grammar_masks.allowed(lanes, follows)
    t4 = time.perf_counter()
    assert all(judged) or not (grammar.JUDGE_AHEAD and grammar.TAKE_LATER)
    for name, seconds in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
        parts[name].append(seconds * 1e6)
print(json.dumps({name: round(statistics.median(times[10:]), 1) for name, times in parts.items()}))

"""Issue 33, the demo's half of the grammar bar: does llguidance's mask fill of 32 lanes spread over the
host's cores? The bench's JSON grammar (tfd bench --grammar json) on the demo's 4,096-token vocabulary, 32
lanes walked 150 tokens (a seeded choice among each mask's allowed tokens), then the same walk replayed
under each way of filling: one executor call for all lanes with 1 to 16 threads, one call a lane, and the
lanes split among Python threads each with an executor of its own. The host's CPU only (no GPU). On the
2-core CI machine (2026-12-05): 1 thread 623 us a fill, 2 threads 520, a call a lane 451; the H200's
demo step is 0.44 ms plain, 1.42 with the grammar. Run after install.sh:
``PYTHONPATH=/tmp/site python .dev/grammar_threads.py``."""
import os
import random
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import llguidance
import torch

from tfd.bench.command import records_grammar
from tfd.demo import ASSETS

LANES, STEPS, VOCAB = 32, 150, 4096
grammar = records_grammar((ASSETS / "demo_tokenizer.json").read_text(), VOCAB, (0,), 256)
mask = torch.zeros(LANES, VOCAB // 32, dtype=torch.int32)
WIDTH = VOCAB // 8  # a mask row's bytes


def fresh() -> list[llguidance.LLMatcher]:
    return [grammar.prepared(1).matcher().inner for _ in range(LANES)]


def walk() -> list[list[int]]:
    """Each step's tokens, a lane each, allowed by its mask (seeded)."""
    draw, matchers, executor, found = random.Random(0), fresh(), llguidance.LLExecutor(1), []
    every = torch.arange(VOCAB)
    for _ in range(STEPS):
        executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], mask.data_ptr(), WIDTH,
                                         LANES)
        allowed = ((mask[:, every // 32] >> (every % 32)) & 1).bool()
        tokens = [draw.choice(allowed[i].nonzero().flatten().tolist()) for i in range(LANES)]
        for matcher, token in zip(matchers, tokens, strict=True):
            assert matcher.consume_token(token)
        found.append(tokens)
    return found


Fill = Callable[[list[llguidance.LLMatcher]], None]


def replay(steps: list[list[int]], fill: Fill) -> tuple[float, float]:
    """Median and mean us of ``fill`` over the walk, fresh matchers taking its tokens."""
    matchers, times = fresh(), []
    for tokens in steps:
        began = time.perf_counter()
        fill(matchers)
        times.append(time.perf_counter() - began)
        for matcher, token in zip(matchers, tokens, strict=True):
            matcher.consume_token(token)
    return statistics.median(times) * 1e6, statistics.mean(times) * 1e6


def batched(threads: int) -> Fill:
    executor = llguidance.LLExecutor(threads)

    def fill(ms: list[llguidance.LLMatcher]) -> None:
        executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(ms)], mask.data_ptr(), WIDTH, LANES)
    return fill


def split(threads: int) -> Fill:
    pool, executors = ThreadPoolExecutor(threads), [llguidance.LLExecutor(1) for _ in range(threads)]

    def fill(ms: list[llguidance.LLMatcher]) -> None:
        def part(k: int) -> None:
            executors[k].unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(ms) if i % threads == k],
                                                 mask.data_ptr(), WIDTH, LANES)
        list(pool.map(part, range(threads)))
    return fill


def one_call_a_lane(ms: list[llguidance.LLMatcher]) -> None:
    for i, m in enumerate(ms):
        single.unsafe_compute_mask_ptr([(m, i)], mask.data_ptr(), WIDTH, LANES)


single = llguidance.LLExecutor(1)
steps = walk()
print(f"{os.cpu_count()} CPUs; llguidance {llguidance.__version__}; {LANES} lanes, {STEPS} steps")
ways = [(f"one call, {n} threads", batched(n)) for n in (1, 2, 4, 8, 12, 16)]
ways += [("one call a lane", one_call_a_lane)] + [(f"{n} python threads", split(n)) for n in (2, 4, 8, 16)]
for _ in range(2):  # twice: the host's drift shows
    for name, fill in ways:
        median, mean = replay(steps, fill)
        print(f"{name}: median {median:.0f} us, mean {mean:.0f} us", flush=True)

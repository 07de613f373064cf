"""The daemon's warm-up before READY: the kernel variants the serving path takes, each run once.

Triton compiles a kernel for each specialization a launch meets: its constexprs (the GEMM's tiles
are chosen by rows: up to 64, 65 to 128, more) and, for each integer argument, whether it is 1 and
whether it is a multiple of 16. A client whose request meets a variant first waits for its compile:
on an H200 with an empty Triton cache the first 32 chats after READY took 17.2 s, the next 8 took
0.2 s. The decode and verify graphs compile their variants when they are captured at load; the
full warm-up sends through the engine, as clients' requests go, waves of requests that meet the
rest (``waves``):

1. prompts alone, one a step, whose rows are 1, a multiple of 16 and neither, in each of the GEMM's
   row classes (``GEMM_CLASSES``, its tiles' rows: the GEMM specializes on its rows), and a whole
   step of TF_STEP_TOKENS rows and past it; with sparse attention's pooled keys (Flash Next), whose
   products take a prompt's rows over the compress ratio, those rows times the ratio too, and prompts
   of every power of two of blocks up to ``block_choice.MOST_BLOCKS`` (its choice sorts a row's blocks
   padded to the next power of two: a variant each);
2. lanes together of different lengths, so steps mix prompt chunks with decode rows: as many lanes
   as the prompts alone have rows (the rows that draw a token are the lanes'), 3, and all the pool has;
3. sampling with cuts (top-k, top-p, min-p), seeded temperature and logprobs, and under a grammar
   (a JSON object's: its masks filled and applied), drafted and not; and grammar lanes alone, greedy
   and tempered with nothing cut, whose steps the keyed draw redraws reading their masks;
4. a long prompt (past two attention spans of 2,048 keys and decode's 4,096-key split, where the
   context allows) and its next turn, resumed from the state it kept.

The short warm-up is one request of 4 tokens: where nothing compiles (the CPU's reference path) it
checks the engine and the pool's census and costs nothing. The plan is pure arithmetic on the limits.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence

import trio

from tfd.engine.config import Limits
from tfd.engine.engine import Engine
from tfd.engine.grammar import Grammar
from tfd.engine.request import Finished, Request, Sampling
from tfd_kernels.block_choice import MOST_BLOCKS
from tfd_kernels.gemm_plan import FEW, MID, MIDDLE, SPREAD_ROWS

log = logging.getLogger("tfd.warm_up")
NEW = 3  # tokens a warm-up request makes: its prefill's draw, then decode steps
# the GEMM's row classes, each a tile of its own: its rows specialize on 1 and multiples of 16 within
GEMM_CLASSES = ((1, FEW.block_m), (FEW.block_m + 1, MID.block_m), (MID.block_m + 1, SPREAD_ROWS),
                (SPREAD_ROWS + 1, MIDDLE.block_m), (MIDDLE.block_m + 1, 2 * MIDDLE.block_m))
# prompt rows: 1, then in each class its first rows (not a multiple of 16) and its last multiple of 16
ALONE = tuple(sorted({1} | {low + (low == 1) for low, _ in GEMM_CLASSES}
                    | {high // 16 * 16 for _, high in GEMM_CLASSES}))
# lanes of a step, as many as ALONE's rows (1 is every alone's): the rows that draw a token (the logits'
# product, the sampler) are the lanes', so they too meet each GEMM class with 16k and not (the H200's
# 64-client soak met a 33-64 class variant of the logits' product that 17 lanes had not)
TOGETHER = tuple(sorted((set(ALONE) - {1}) | {3}))
TOGETHER_ROWS = (17, 100, 33)  # their prompts, by turns: some decode while others still prefill
SPAN = 2048  # prefill attention's key span; decode attention splits differently past 4,096 keys
LONG = 2 * SPAN + 81  # past two spans and the split, a tail that is not a multiple of 16
RESUMED = 70  # rows a resumed next turn adds
GREEDY = Sampling(temperature=0.0)
TEMPERED = Sampling(temperature=1.0, seed=4)
CUTS = (Sampling(temperature=0.8, top_k=8, seed=1), Sampling(temperature=0.9, top_p=0.9, seed=2),
        Sampling(temperature=1.0, min_p=0.05, seed=3, logprobs=3), Sampling(temperature=0.0, logprobs=1))


def waves(limits: Limits, vocab: int, drafting: bool, cache: bool, pooled: int = 1,
          grammar: Grammar | None = None) -> list[list[Request]]:
    """The full warm-up's requests, a wave each list: a wave is sent at once, and waited for whole
    before the next. Every request fits the context and the lanes; none is larger than they allow.
    ``pooled``: the rows a pooled key stands for (the sparse attention indexer's compress ratio; 1
    without one), whose products meet each class only at prompts that many times longer;
    ``grammar``: what the grammar requests follow (None: none are sent)."""
    room = limits.context - NEW  # the longest prompt a request may carry
    made: list[list[Request]] = []
    count = [0]

    def request(rows: int, sampling: Sampling = GREEDY, draft: bool = True, start: int = 0,
                follows: Grammar | None = None) -> Request:
        count[0] += 1
        prompt = tuple((7919 * (start + i) + 13) % vocab for i in range(rows))
        return Request(f"warm-up-{count[0]}", prompt, NEW, sampling, arrived=time.monotonic(),
                       draft=draft, cache=cache, grammar=follows)

    scaled = {pooled * rows for rows in ALONE} if pooled > 1 else set()
    # the choice of blocks sorts 2, 4, ... MOST_BLOCKS: a prompt of each many blocks (the H100's Flash Next
    # demo compiled the 512's while serving, 2026-12-05: its prompts alone had ended at 64 and 2,048)
    sorted_by = {pooled << k for k in range(1, MOST_BLOCKS.bit_length())} if pooled > 1 else set()
    every = (*ALONE, *scaled, *sorted_by, limits.step_tokens, limits.step_tokens + 17)
    alone = sorted({rows for rows in every if rows <= room})
    made += [[request(rows, start=rows)] for rows in alone]
    most = limits.max_lanes  # and every lane the pool has, and its largest multiple of 16
    for lanes in sorted({n for n in TOGETHER if n <= most} | {most, most // 16 * 16} - {0, 1}):
        rows = [min(TOGETHER_ROWS[i % len(TOGETHER_ROWS)], room) for i in range(lanes)]
        made.append([request(r, start=1000 * lanes + i) for i, r in enumerate(rows)])
    drafts = (True, False) if drafting else (True,)
    sampled = [request(min(24 + i, room), sampling, draft, start=5000 + 100 * i)
               for i, (sampling, draft) in enumerate((s, d) for d in drafts for s in CUTS)]
    if grammar is not None:
        sampled += [request(min(30 + i, room), sampling, draft, start=7000 + 100 * i, follows=grammar)
                    for i, (sampling, draft) in enumerate((s, d) for d in drafts for s in CUTS[1:3])]
    made += [sampled[i:i + limits.max_lanes] for i in range(0, len(sampled), limits.max_lanes)]
    if grammar is not None:  # drawn plainly but for the masks: a wave of its own, nothing cut beside
        plain = [request(min(30 + i, room), sampling, draft, start=8000 + 100 * i, follows=grammar)
                 for i, (sampling, draft) in enumerate((s, d) for d in drafts for s in (GREEDY, TEMPERED))]
        made += [plain[i:i + limits.max_lanes] for i in range(0, len(plain), limits.max_lanes)]
    made += [[request(1, sampling, start=6000)] for sampling in CUTS]  # a cut alone: one row, drawn eagerly
    long = min(LONG, room)
    if long > max(alone, default=0):
        made.append([request(long, start=9000)])
        if cache and long + RESUMED <= room:
            made.append([request(long + RESUMED, start=9000)])  # the turn after: resumed where it kept
    return made


def by_kernel(variants: Sequence[str]) -> str:
    """``variants`` (``tfd_kernels.runtime.compiled_variants``' form: a name, a key) counted by
    kernel, most first: "_gemm x12, _norm x3"; "none" when empty."""
    counts = Counter(variant.split(" ")[0] for variant in variants)
    return ", ".join(f"{name} x{n}" for name, n in counts.most_common()) or "none"


def short(vocab: int) -> list[list[Request]]:
    """The short warm-up: one request of 4 prompt tokens and 2 new ones."""
    return [[Request("warm-up", tuple(i % vocab for i in range(4)), 2, GREEDY, arrived=time.monotonic())]]


async def warm_up(engine: Engine, plan: Sequence[Sequence[Request]]) -> int:
    """Send each wave of ``plan`` through ``engine`` as the daemon's own work (no client limit
    applies), wait for it whole, then the next. Returns the requests sent. Raises ``RuntimeError``
    naming the first request that failed or was cancelled (the engine's error in its message)."""
    sent = 0
    for wave in plan:
        handles = [engine.submit(request, internal=True) for request in wave]
        sent += len(handles)
        for handle in handles:
            async for event in handle.events:
                if isinstance(event, Finished) and event.reason in ("failed", "cancelled"):
                    rows = len(handle.request.prompt)
                    raise RuntimeError(f"the warm-up request {handle.request.id} ({rows} prompt tokens) "
                                       f"{event.reason}: {event.message}")
        await trio.lowlevel.checkpoint()
    return sent

"""``tfd bench --conversation --streams N``: a conversation's second turn read back from disk while
N - 1 other streams decode, as issue 36 measures it at the engine.

Turn one runs and its kept states are written to a store (``tfd.bench.conversation``); the files are
dropped from the page cache, or kept there (``page_cache``). Then, on a runner of N lanes with an
empty memory and that store (a restart), N - 1 streams of ``OTHER_PROMPT`` tokens start and decode;
once each has drawn ``SETTLE`` tokens, turn two arrives. Its state is read back off the engine thread
while the others go on. Measured from the steps' clocks: the others' time between tokens while turn
two's state was read (from its arrival to the step that admitted it) against before it arrived; turn
two's first token against (its read time + the time its new tokens take cold, alone); and its tokens
against a cold runner's, which must be the same.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from tfd.bench.conversation import IDENTITY, closed, drop_page_cache, first_turn
from tfd.bench.workload import RESTORE_POLL_S, drive
from tfd.cache.learned import Learned
from tfd.engine.lane import Lane, Phase
from tfd.engine.local_runner import runner_for
from tfd.engine.request import Request, Sampling
from tfd.engine.runner import Runner
from tfd.engine.scheduler import Scheduler
from tfd.engine.stepper import Stepper
from tfd.families.hybrid import HybridModel
from tfd.store.store import Store

OTHER_PROMPT = 1024  # the decoding streams' prompts (turn one's when shorter)
SETTLE = 8  # tokens each other stream draws before turn two arrives: all of them are decoding
AFTER = 16  # steps the others run after turn two's first token, then they are cancelled


def read_beside(model: HybridModel, prompt_tokens: int, new_tokens: int, streams: int, graphs: bool,
                step_tokens: int, page_cache: bool, seed: int = 0) -> dict[str, Any]:
    """One measurement (see the module); ``streams`` >= 2. Nothing is compiled first: the caller warms
    (``read_beside_bench`` runs a shorter conversation, untimed)."""
    if streams < 2:
        raise ValueError(f"reading back beside other streams needs streams >= 2, not {streams}")
    root = Path(tempfile.mkdtemp(prefix="tfd-bench-beside-"))
    try:
        turn = first_turn(model, prompt_tokens, new_tokens, graphs, step_tokens, seed, root, 0)
        second, window = turn.second, turn.window
        if not page_cache:
            drop_page_cache(root)
        generator = torch.Generator().manual_seed(seed + 1)  # the other streams' prompts
        length = min(OTHER_PROMPT, prompt_tokens)
        others = [Request(f"other-{i}", tuple(torch.randint(0, model.cfg.vocab, (length,),
                                                            generator=generator).tolist()),
                          window - length, Sampling(temperature=0.0)) for i in range(streams - 1)]
        runner = runner_for(model, window, streams, graphs, kept_states=1)
        assert runner.cache is not None
        learned = Learned(Store(root, IDENTITY, 1 << 50, 1 << 50, 0), runner.pool, runner.pool.buffer.device,
                          context=window, lanes=streams)
        runner.cache.attach(learned)
        found = _timed(runner, others, second, step_tokens)
        counts = closed(runner)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    cold = drive(model, [second], step_tokens, graphs)
    new_only = Request("new", second.prompt[found["cached"]:], 1, Sampling(temperature=0.0))
    new_cold_s = drive(model, [new_only], step_tokens, graphs).first_token_s[0]
    if found["tokens"] != cold.tokens[0]:
        raise AssertionError("turn two read back beside other streams drew other tokens than cold")
    bound = counts.read_s + new_cold_s
    return {"streams": streams, "prompt_tokens": prompt_tokens, "turn2_prompt_tokens": len(second.prompt),
            "cached_tokens": found["cached"], "page_cache": page_cache, "bytes_read": counts.bytes_read,
            "read_s": counts.read_s, "new_tokens_cold_s": new_cold_s, "ttft_s": found["ttft_s"],
            "ttft_over_read_and_new": found["ttft_s"] / bound if bound else None,
            "others_gap_before_ms": found["before_ms"], "others_gap_during_ms": found["during_ms"],
            "others_gap_ratio": found["during_ms"] / found["before_ms"] if found["before_ms"] else None,
            "steps_during": found["steps_during"], "tokens_equal": True}


def _timed(runner: Runner, others: list[Request], second: Request, step_tokens: int) -> dict[str, Any]:
    """Step ``others`` until each has drawn ``SETTLE`` tokens, add ``second``, go on until it has
    drawn its tokens (the others cancelled ``AFTER`` steps past its first); the clocks."""
    stepper = Stepper(Scheduler(step_tokens, len(others) + 1), runner, time.perf_counter)
    lanes = [Lane(i, request) for i, request in enumerate(others)]
    for lane in lanes:
        stepper.add(lane)
    gaps_before: list[float] = []
    last = None
    while not all(len(lane.generated) >= SETTLE for lane in lanes):
        step = stepper.step()
        step.raise_failures()
        if any(emission.lane in lanes for emission in step.emitted):
            if last is not None and all(lane.phase is Phase.DECODE for lane in lanes):
                gaps_before.append(step.ran_at - last)
            last = step.ran_at
    resumed = Lane(len(lanes), second)
    arrived = time.perf_counter()
    stepper.add(resumed)
    gaps_during: list[float] = []
    admitted_at = first_at = None
    after = 0
    while not stepper.idle:
        step = stepper.step()
        step.raise_failures()
        if resumed in step.admitted:
            admitted_at = step.ran_at
        if admitted_at is None and any(emission.lane in lanes for emission in step.emitted):
            if last is not None:
                gaps_during.append(step.ran_at - last)
            last = step.ran_at
        if first_at is None and resumed.first_token_at is not None:
            first_at = resumed.first_token_at
        if first_at is not None and (after := after + 1) == AFTER:
            for lane in lanes:
                lane.cancel()
        if not step.works and runner.restoring:
            time.sleep(RESTORE_POLL_S)
    assert first_at is not None
    return {"tokens": tuple(resumed.generated), "cached": resumed.cached, "ttft_s": first_at - arrived,
            "before_ms": 1e3 * statistics.median(gaps_before) if gaps_before else None,
            "during_ms": 1e3 * statistics.median(gaps_during) if gaps_during else None,
            "steps_during": len(gaps_during)}

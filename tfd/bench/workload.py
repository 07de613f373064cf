"""A benchmark workload run through the engine's own scheduler and runner, on the calling thread.

``streams`` requests of ``prompt_tokens`` random prompt tokens each ask for ``new_tokens`` tokens
(keyed sampling at temperature 1, no stop tokens, so every stream runs to its length). The loop
is the engine thread's (``tfd.engine.stepper``) without the trio side. Prefill is timed from the
start to the last stream's first token; decode from the end of one step in which every stream
decodes to the end of the next, the host's bookkeeping between them included (the runner launches
a decode step before the host waits for the one before, so time inside ``run`` alone would leave
out device time).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence

import attrs
import torch
from torch.profiler import record_function

from tfd.bench.defaults import STEP_TOKENS
from tfd.bench.idle import STEP
from tfd.engine.drafts import DraftCounts
from tfd.engine.grammar import Grammar
from tfd.engine.lane import Lane
from tfd.engine.local_runner import runner_for
from tfd.engine.request import Request, Sampling
from tfd.engine.rounds import Propose
from tfd.engine.runner import Drafting, Runner
from tfd.engine.scheduler import Scheduler
from tfd.engine.stepper import Stepper
from tfd.families.hybrid import HybridModel

RESTORE_POLL_S = 0.001  # how often a drive with nothing to run looks for a state read back


@attrs.frozen
class Workload:
    streams: int
    prompt_tokens: int
    new_tokens: int
    step_tokens: int = STEP_TOKENS
    drafting: Drafting | None = None  # lanes verify the MTP head's drafts in rounds
    temperature: float = 1.0
    prompts: tuple[tuple[int, ...], ...] | None = None  # token ids to cut prompts from, else random
    grammar: Grammar | None = attrs.field(default=None, eq=False)  # what every stream follows
    grammar_name: str = "none"


@attrs.frozen
class Timings:
    tokens: tuple[tuple[int, ...], ...]  # each request's tokens, in order
    prefill_s: float  # start to the last stream's first token
    first_token_s: tuple[float, ...]  # each stream's time to first token
    decode_steps: int  # steps in which every stream decoded, after the first such (timed end to end)
    decode_s: float
    decode_tokens: int  # tokens those steps gave (a step per stream, a verify round's kept rows)
    graphs: bool  # decode steps replayed CUDA graphs
    peak_bytes: int  # device memory allocated at most
    drafts: DraftCounts = attrs.Factory(DraftCounts)  # all streams' rounds, drafts and accepted ones
    cached: tuple[int, ...] = ()  # each request's prompt tokens resumed from a kept state
    last_token_s: tuple[float, ...] = ()  # each stream's time to its last token


def run(model: HybridModel, workload: Workload, graphs: bool, seed: int = 0) -> Timings:
    """Run ``workload``: prompts cut at random from ``workload.prompts`` (or random tokens), keyed
    sampling at its temperature."""
    generator = torch.Generator().manual_seed(seed)
    # a matcher of its own for each stream's lane, as the daemon compiles them for a request's choices
    grammar = None if workload.grammar is None else workload.grammar.prepared(workload.streams)
    requests = []
    for number in range(workload.streams):
        requests.append(Request(f"bench-{number}", prompt_of(workload, model.cfg.vocab, generator),
                                workload.new_tokens, Sampling(temperature=workload.temperature,
                                                              seed=seed + number), grammar=grammar))
    return drive(model, requests, workload.step_tokens, graphs, drafting=workload.drafting)


def prompt_of(workload: Workload, vocab: int, generator: torch.Generator) -> tuple[int, ...]:
    """``workload.prompt_tokens`` tokens: a random cut of a random one of ``workload.prompts`` long
    enough (ValueError when none is), or random ids."""
    length = workload.prompt_tokens
    if workload.prompts is None:
        return tuple(torch.randint(0, vocab, (length,), generator=generator).tolist())
    long_enough = [ids for ids in workload.prompts if len(ids) >= length]
    if not long_enough:
        raise ValueError(f"no prompt text holds {length} tokens")
    ids = long_enough[int(torch.randint(len(long_enough), (1,), generator=generator))]
    start = int(torch.randint(len(ids) - length + 1, (1,), generator=generator))
    return tuple(ids[start:start + length])


def marked() -> contextlib.AbstractContextManager[object]:
    """A profiled run's range around an engine step (``tfd.bench.idle``); nothing otherwise."""
    if torch.autograd.profiler._is_profiler_enabled:
        return record_function(STEP)
    return contextlib.nullcontext()


def drive(model: HybridModel, requests: Sequence[Request], step_tokens: int, graphs: bool,
          leaves: Mapping[str, int] | None = None, drafting: Drafting | None = None,
          propose: Propose | None = None, runner: Runner | None = None) -> Timings:
    """Run ``requests`` together through the engine's stepper, each to its ``max_tokens`` or a stop
    token, on a pool sized for all of them (or ``runner``'s, whose kept prompt states then carry over
    from call to call); every lane's pages go back at the end (``Leak`` if not).
    ``leaves``: request id to the tokens after which it is cancelled, as a client leaving would be
    (it leaves at the next plan and gives its pages back). ``drafting``: lanes draft and verify in
    rounds (``Runner``'s, with ``propose``)."""
    device = model.weights.embed.device
    window = max(request.window for request in requests)
    streams = len(requests)
    if runner is None:
        runner = runner_for(model, window, streams, graphs, drafting, propose)
    pool = runner.pool
    stepper = Stepper(Scheduler(step_tokens, streams), runner, lambda: time.perf_counter() - began, leaves)
    lanes = [Lane(number, request) for number, request in enumerate(requests)]  # tokens, no text
    for lane in lanes:
        stepper.add(lane)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    began = time.perf_counter()
    steps, decode_s, decode_tokens = 0, 0.0, 0
    last_token: dict[int, float] = {}  # a lane's number: when it drew its latest token
    last: float | None = None  # the end of the previous step, when every stream decoded in it
    while not stepper.idle:
        with marked():
            step = stepper.step()  # its run ends in the step's one host sync
        step.raise_failures()
        if not step.works and runner.restoring:  # nothing to run until a state is read back
            time.sleep(RESTORE_POLL_S)
        everyone = len(step.works) == streams and all(work.decode for work in step.works)
        if everyone and last is not None:  # end to end: the device runs ahead while the host books
            steps, decode_s = steps + 1, decode_s + step.ran_at - last
            decode_tokens += sum(len(emission.tokens) for emission in step.emitted)
        last = step.ran_at if everyone else None
        for emission in step.emitted:
            last_token[emission.lane.number] = step.ran_at
    pool.check_at_load()
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    ttft = tuple(lane.first_token_at for lane in lanes if lane.first_token_at is not None)
    assert len(ttft) == streams  # every stream ran to its length, so each drew a first token
    drafts = DraftCounts()
    for lane in lanes:
        drafts.rounds += lane.counts.rounds
        drafts.drafted += lane.counts.drafted
        drafts.accepted += lane.counts.accepted
    return Timings(tuple(tuple(lane.generated) for lane in lanes), max(ttft), ttft, steps, decode_s,
                   decode_tokens, runner.graphs is not None, peak, drafts,
                   tuple(lane.cached for lane in lanes), tuple(last_token[lane.number] for lane in lanes))

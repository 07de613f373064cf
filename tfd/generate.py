"""``tfd generate``: one prompt's greedy continuation through the engine's stepper, without a server.

The request runs as the daemon would run it (``tfd.engine.stepper``: the scheduler's prompt chunks,
the runner's batched decode steps, the finish rule) on a pool that holds its one lane, on the
calling thread; its tokens are the ones ``tfd serve`` gives the same prompt at temperature 0.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import attrs

from tfd.engine.lane import Lane
from tfd.engine.local_runner import runner_for
from tfd.engine.request import Request, Sampling
from tfd.engine.scheduler import Scheduler
from tfd.engine.stepper import Stepper
from tfd.families.hybrid import HybridModel

STEP_TOKENS = 256  # prompt rows a step: four GDN chunks


@attrs.frozen
class Generated:
    """The tokens (a stop token kept, ending them), the seconds to the first token and after it."""

    tokens: list[int]
    prefill_s: float
    decode_s: float


def generate(model: HybridModel, prompt: Sequence[int], max_tokens: int, stop: Sequence[int] = ()
             ) -> Generated:
    """The greedy continuation of ``prompt``: up to ``max_tokens`` tokens, ending at a ``stop`` id.
    ValueError for an empty prompt; what a step raises is raised (RuntimeError for a lane that could
    not be opened), the lane's pages given back."""
    if not prompt:
        raise ValueError("the prompt has no tokens")
    request = Request("generate", tuple(prompt), max_tokens, Sampling(temperature=0.0), stop_ids=tuple(stop))
    runner = runner_for(model, request.window, 1, graphs=False)
    began = time.monotonic()
    stepper = Stepper(Scheduler(STEP_TOKENS, 1), runner, lambda: time.monotonic() - began)
    lane = Lane(0, request)
    stepper.add(lane)
    while not stepper.idle:
        step = stepper.step()
        step.raise_failures()
    runner.pool.check_at_load()
    done = time.monotonic() - began
    first = done if lane.first_token_at is None else lane.first_token_at
    return Generated(list(lane.generated), first, done - first)

"""What an engine is built with: its limits and settings (``EngineConfig``, read from the environment
table once, at start) and the calls it makes back to its host (``Hooks``)."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from tfd.engine.runner import Drafting


@attrs.frozen
class Limits:
    context: int  # the most rows one lane may hold: prompt + max_tokens
    step_tokens: int
    max_lanes: int
    queue: int  # requests waiting for admission at most; more are refused with 503


@attrs.frozen
class EngineConfig:
    """``graphs``: decode steps and verify rounds replay CUDA graphs captured at build (CUDA only);
    ``drafting``: lanes that ask verify the MTP head's drafts; ``kept_bytes``: the prompt cache's
    budget (0: no cache), ``keep_gain``: tokens a resumed lane prefills before it keeps again."""

    limits: Limits
    graphs: bool = False
    drafting: Drafting | None = None
    kept_bytes: int = 0
    keep_gain: int = 0


@attrs.frozen
class Hooks:
    """``beat``: the engine thread's heartbeat, once a step and at least every idle wait (on the
    engine thread); ``on_failure``: the engine stopped after an error; ``on_step``: (seconds, rows)
    after each step (both on the trio thread)."""

    beat: Callable[[], None] | None = None
    on_failure: Callable[[BaseException], None] | None = None
    on_step: Callable[[float, int], None] | None = None

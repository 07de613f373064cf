"""What an engine is built with: its rows of the environment table (``EngineRows``, read once, at
start), the limits and settings they come to once the pool is cut (``EngineConfig``), and the calls it
makes back to its host (``Hooks``)."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from tfd.engine.runner import Drafting
from tfd.env import Settings
from tfd.pool.config import GIB


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


@attrs.frozen
class EngineRows:
    """The engine's rows: TF_CONTEXT, TF_PARALLEL (None: as many lanes as fit), TF_STEP_TOKENS (None:
    by the device), TF_QUEUE_LIMIT, TF_CUDA_GRAPHS, TF_PROMPT_CACHE_GIB (None: the whole pool; 0:
    none), TF_PROMPT_KEEP_GAIN, TF_DRAFTS and the MTP head's TF_MTP_DRAFTS, TF_MTP_CONFIDENCE,
    TF_MTP_MAX_LANES."""

    context: int
    parallel: int | None
    step_tokens: int | None
    queue: int
    graphs: bool
    cache_gib: float | None
    keep_gain: int
    drafts: bool
    mtp_drafts: int
    mtp_confidence: float
    mtp_max_lanes: int

    @classmethod
    def from_settings(cls, settings: Settings) -> EngineRows:
        return cls(settings.value("TF_CONTEXT", int), settings.optional("TF_PARALLEL", int),
                   settings.optional("TF_STEP_TOKENS", int), settings.value("TF_QUEUE_LIMIT", int),
                   settings.value("TF_CUDA_GRAPHS", bool), settings.optional("TF_PROMPT_CACHE_GIB", float),
                   settings.value("TF_PROMPT_KEEP_GAIN", int), settings.value("TF_DRAFTS", bool),
                   settings.value("TF_MTP_DRAFTS", int), settings.value("TF_MTP_CONFIDENCE", float),
                   settings.value("TF_MTP_MAX_LANES", int))

    def drafting(self, head_drafts: bool) -> Drafting | None:
        """How lanes draft with TF_DRAFTS on and a model whose head drafts (``head_drafts``); None
        otherwise."""
        if not self.drafts or not head_drafts:
            return None
        return Drafting(self.mtp_drafts, self.mtp_confidence, self.mtp_max_lanes)

    def config(self, step_tokens: int, max_lanes: int, drafting: Drafting | None, pool_bytes: int
               ) -> EngineConfig:
        """The engine's config once the pool is cut: ``step_tokens`` (TF_STEP_TOKENS or the device's),
        ``max_lanes`` the pool holds, the prompt cache's budget out of the pool's ``pool_bytes``."""
        cache = pool_bytes if self.cache_gib is None else int(self.cache_gib * GIB)
        limits = Limits(context=self.context, step_tokens=step_tokens, max_lanes=max_lanes, queue=self.queue)
        return EngineConfig(limits, self.graphs, drafting, cache, self.keep_gain)

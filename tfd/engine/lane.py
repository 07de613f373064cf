"""A lane: one request's sequence as the engine runs it, from admission to its last token.

Plain data that the scheduler reads (phase, position, lengths) and the engine thread updates; the
lease and memory views are the runner's. Owned by the engine thread alone.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from tfd.cache.prefixes import Prefixes, keep_points
from tfd.engine.drafts import DraftCounts
from tfd.engine.request import Request, prompt_seed

if TYPE_CHECKING:
    from tfd.engine.detokenize import Detokenizer
    from tfd.model.memory import LaneMemory
    from tfd.pool.pages import Lease


class Phase(enum.Enum):
    WAITING = "waiting"  # queued: no pages yet
    PREFILL = "prefill"  # admitted: its prompt is going through in chunks
    DECODE = "decode"  # one row a step
    DONE = "done"


class Lane:
    def __init__(self, number: int, request: Request, detokenizer: Detokenizer) -> None:
        self.number = number
        self.request = request
        self.detokenizer = detokenizer
        self.phase = Phase.WAITING
        self.position = 0  # rows of the sequence already computed into the lane's state
        self.generated: list[int] = []
        seed = request.sampling.seed
        self.seed = seed if seed is not None else prompt_seed(request.prompt)
        self.cancelled = False
        self.lease: Lease | None = None
        self.memory: LaneMemory | None = None
        self.first_token_at: float | None = None
        self.drafting = False  # its decode steps are verify rounds (the runner decides at open)
        self.drafts: list[int] = []  # the drafts its next round verifies after its pending token
        self.counts = DraftCounts()
        self.keep_points = keep_points(len(request.prompt), request.keep_at)  # prefill chunks end there
        self.cached = 0  # prompt tokens resumed from a kept state
        self.prefixes = Prefixes(request.prompt)  # the prompt as the cache names it

    def record(self, token: int, now: float) -> None:
        """A token drawn for this lane: kept, the lane decodes from here, the first one's time noted."""
        self.generated.append(token)
        self.phase = Phase.DECODE
        if self.first_token_at is None:
            self.first_token_at = now

    @property
    def prompt_length(self) -> int:
        return len(self.request.prompt)

    @property
    def next_position(self) -> int:
        """Where the token drawn next goes in the sequence."""
        return self.prompt_length + len(self.generated)

    def describe(self) -> dict[str, object]:
        """What admin ``lanes`` shows of it."""
        lease = self.lease
        return {"lane": self.number, "request": self.request.id, "phase": self.phase.value,
                "prompt_tokens": self.prompt_length, "cached_tokens": self.cached,
                "generated": len(self.generated),
                "position": self.position, "window": self.request.window,
                "pages": None if lease is None else len(lease.row_pages) + len(lease.state_pages),
                "drafting": self.drafting, "rounds": self.counts.rounds, "drafted": self.counts.drafted,
                "accepted": self.counts.accepted}

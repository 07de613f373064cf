"""Which rows each step runs: pure Python, page counts and positions only, never a tensor.

Once a step: every decoding lane gets its row, a drafting lane its window (a running lane never
waits); prefilling lanes get prompt chunks, oldest first, from what is left of the step's token
budget; then waiting requests are admitted, oldest first and strictly in order, while the pool can
promise their window (the ``admit`` callback), the budget lasts and the next is not behind a leader
whose prompt is still going through (``Lane.behind_leader``). A prefill chunk ends at a
multiple of ``CHUNK`` absolute positions or at the end of the prompt, whatever the budget, so every
split of a prompt cuts the GDN chunks in the same places; a chunk also ends at the lane's next keep
point (a multiple of ``CHUNK``: its state is kept there); the oldest prefilling lane always gets at
least one chunk, so decode rows never starve it. A lane whose state is being read back from disk
runs nothing until the read has ended. Cancelled lanes leave at the step boundary.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable

import attrs

from tfd.engine.lane import Lane, Phase
from tfd.model import GDN_CHUNK as CHUNK


@attrs.frozen
class Work:
    """``length`` rows of ``lane`` from position ``start``; ``samples``: the last row's logits
    draw the lane's next token. ``verify``: a drafting lane's window, its pending token and its
    drafts (``tfd.engine.rounds``): every row draws, and the lane keeps as many rows as hold."""

    lane: Lane
    start: int
    length: int
    decode: bool
    samples: bool
    verify: bool = False


@attrs.frozen
class Plan:
    works: tuple[Work, ...]
    cancelled: tuple[Lane, ...]
    dropped: tuple[Lane, ...] = ()  # admissions that failed: they leave the queue


class Admission(enum.Enum):
    ADMITTED = "admitted"
    WAIT = "wait"  # the pool cannot promise the window now: admission stops for this step
    DROPPED = "dropped"  # the lane could not be opened: it leaves the queue


class Scheduler:
    def __init__(self, step_tokens: int, max_lanes: int) -> None:
        if step_tokens < CHUNK or step_tokens % CHUNK:
            raise ValueError(f"step_tokens must be a multiple of {CHUNK}, got {step_tokens}")
        self.step_tokens = step_tokens
        self.max_lanes = max_lanes
        self.waiting: deque[Lane] = deque()
        self.running: list[Lane] = []

    def add(self, lane: Lane) -> None:
        self.waiting.append(lane)

    def retire(self, lane: Lane) -> None:
        """Forget a lane that finished."""
        lane.retire()
        if lane in self.running:
            self.running.remove(lane)

    def plan(self, admit: Callable[[Lane], Admission]) -> Plan:
        cancelled = tuple(lane for lane in (*self.waiting, *self.running) if lane.cancelled)
        for lane in cancelled:
            if lane in self.waiting:
                self.waiting.remove(lane)
            self.retire(lane)

        works: list[Work] = []
        budget = self.step_tokens
        for lane in self.running:
            if lane.phase is Phase.DECODE:
                rows = 1 + len(lane.drafts)
                works.append(Work(lane, lane.position, rows, decode=True, samples=True, verify=lane.drafting))
                budget -= rows
        first = True
        for lane in self.running:
            if lane.phase is Phase.PREFILL:
                size = self._chunk(lane, budget, first)
                if not size:
                    break
                works.append(self._prefill(lane, size))
                budget, first = budget - size, False
        dropped = []
        while self.waiting and len(self.running) < self.max_lanes and (budget > 0 or first):
            lane = self.waiting[0]
            if lane.behind_leader:  # strictly in order: the lanes behind it wait too
                break
            outcome = admit(lane)
            if outcome is Admission.WAIT:
                break
            self.waiting.popleft()
            if outcome is Admission.DROPPED:
                dropped.append(lane)
                lane.retire()
                continue
            self.running.append(lane)
            lane.admitted()
            restoring = lane.phase is not Phase.PREFILL
            size = 0 if restoring else self._chunk(lane, budget, first)
            if size:
                works.append(self._prefill(lane, size))
                budget, first = budget - size, False
        return Plan(tuple(works), cancelled, tuple(dropped))

    @staticmethod
    def _chunk(lane: Lane, budget: int, first: bool) -> int:
        """Rows of ``lane``'s prompt this step: to a chunk multiple, the next keep point (where its
        state is kept) or the prompt's end."""
        stop = next((point for point in lane.keep_points if point > lane.position), lane.prompt_length)
        left = stop - lane.position
        if left <= budget:
            return left
        end = (lane.position + budget) // CHUNK * CHUNK
        if end > lane.position:
            return end - lane.position
        if not first:
            return 0
        return min(left, (lane.position // CHUNK + 1) * CHUNK - lane.position)

    @staticmethod
    def _prefill(lane: Lane, size: int) -> Work:
        ends = lane.position + size == lane.prompt_length
        return Work(lane, lane.position, size, decode=False, samples=ends)

    @property
    def load(self) -> int:
        """Lanes running or waiting."""
        return len(self.running) + len(self.waiting)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

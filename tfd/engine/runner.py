"""The runner: owns the device side of lanes (leases, views) and runs a step's rows.

It opens an admitted lane (its state pieces on pages, zeroed or initialised by the model), takes
row pages as rows grow, runs one forward over every work of the step, applies the head only to the
rows that draw a token, and samples them on the device with the keyed sampler. One host sync a
step: the drawn tokens come back to Python for the scheduler's bookkeeping.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from tfd.engine.lane import Lane
from tfd.engine.request import TokenLogprob
from tfd.engine.sampling import Rows, logprobs, sample
from tfd.engine.scheduler import Work
from tfd.families.hybrid import HybridModel
from tfd.model.memory import LaneMemory, PageRows, Span
from tfd.pool.pages import Pool


@attrs.frozen
class Drawn:
    """A work's drawn token and, when asked, its log-probabilities."""

    work: Work
    token: int
    logprob: TokenLogprob | None


class Runner:
    def __init__(self, model: HybridModel, pool: Pool) -> None:
        self.model = model
        self.pool = pool
        self.rows = PageRows(pool)
        self.device = pool.buffer.device

    def open(self, lane: Lane) -> None:
        """Give an admitted lane (its lease promised) its state pieces, initialised.

        Error handling: on failure the lease is finished, so the pool is as before.
        """
        lease = lane.lease
        assert lease is not None
        try:
            pieces = lease.open(self.model.init_state)
        except BaseException:
            lease.finish()
            lane.lease = None
            raise
        lane.memory = LaneMemory(pieces, lease.page_table)

    def close(self, lane: Lane) -> None:
        """Give the lane's pages back (again: nothing)."""
        if lane.lease is not None:
            lane.lease.finish()
        lane.lease, lane.memory = None, None

    def run(self, works: Sequence[Work]) -> list[Drawn]:
        """Run every work's rows in one forward; draw a token for each work that samples."""
        spans = []
        for work in works:
            lane = work.lane
            assert lane.lease is not None and lane.memory is not None
            lane.lease.take(work.start + work.length)
            ids = [lane.generated[-1]] if work.decode else \
                lane.request.prompt[work.start:work.start + work.length]
            tokens = torch.tensor(ids, dtype=torch.long, device=self.device)
            spans.append(Span(lane.memory, work.start, tokens, decode=work.decode))
        with torch.no_grad():
            hidden = self.model.forward(spans, self.rows).hidden
            drawing = [i for i, work in enumerate(works) if work.samples]
            if not drawing:
                return []
            ends, at = [], 0
            for work in works:
                at += work.length
                ends.append(at - 1)
            rows = torch.tensor([ends[i] for i in drawing], device=self.device)
            logits = self.model.logits(hidden[rows]).float()
            lanes = [works[i].lane for i in drawing]
            tokens = sample(logits, Rows.of([lane.request.sampling for lane in lanes],
                                            [lane.seed for lane in lanes],
                                            [lane.next_position for lane in lanes], self.device))
            asked = [lane.request.sampling.logprobs for lane in lanes]
            details: list[TokenLogprob | None] = [None] * len(lanes)
            if any(n is not None for n in asked):
                top = max(n or 0 for n in asked)
                for i, entry in enumerate(logprobs(logits, tokens, top)):
                    n = asked[i]
                    if n is not None:
                        details[i] = attrs.evolve(entry, top=entry.top[:n])
            drawn = tokens.tolist()  # the step's one sync with the host
        return [Drawn(works[i], token, detail)
                for i, token, detail in zip(drawing, drawn, details, strict=True)]

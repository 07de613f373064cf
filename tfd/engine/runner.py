"""The runner: owns the device side of lanes (leases, views) and runs a step's rows.

It opens an admitted lane (its state pieces on pages, zeroed or initialised by the model), takes
row pages as rows grow, runs the step's decode rows as one batched pass (``model.decode``, the head
and the plain keyed draw: a CUDA graph replay when captured) and its prompt chunks as one forward
over their spans, applies the head only to the rows that draw a token, and samples them on the
device with the keyed sampler (again over the decode rows' logits when a lane cuts top-k/p or
min-p, or when prompt rows draw too). Host-to-device copies go from pinned memory without waiting.
One host sync a step: the drawn tokens come back to Python for the scheduler's bookkeeping.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from tfd.engine.graphs import DecodeGraphs
from tfd.engine.lane import Lane
from tfd.engine.request import TokenLogprob
from tfd.engine.sampling import Rows, draw, logprobs, plain, sample
from tfd.engine.scheduler import Work
from tfd.families.hybrid import HybridModel
from tfd.model.decode import Columns, DecodeBatch, DecodeMemory
from tfd.model.memory import LaneMemory, PageRows, Span, to_device
from tfd.pool.pages import Pool


@attrs.frozen
class Drawn:
    """A work's drawn token and, when asked, its log-probabilities."""

    work: Work
    token: int
    logprob: TokenLogprob | None


class Runner:
    """``context``: the most rows a lane may hold (the width of a decode step's page tables).
    ``graphs``: replay captured CUDA graphs for decode steps (CUDA only; captured here, at load)."""

    def __init__(self, model: HybridModel, pool: Pool, context: int, max_lanes: int,
                 graphs: bool = False) -> None:
        self.model = model
        self.pool = pool
        self.rows = PageRows(pool)
        self.device = pool.buffer.device
        self.offsets: dict[int, tuple[list[int], list[int]]] = {}  # lane number: state_at, tail_at
        self.memory: DecodeMemory | None = None
        self.graphs: DecodeGraphs | None = None
        self.gdn_names = model.gdn_layers().layers
        self.columns = Columns(len(self.gdn_names), pool.layout.row_pages(context))
        if model.batches_decode:
            self.memory = DecodeMemory(pool, model.dtype)
            if graphs and self.device.type == "cuda":
                self.graphs = DecodeGraphs(self._step, self.columns, pool.null_page, max_lanes, self.device)

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
        if self.memory is not None:
            names = self.gdn_names
            self.offsets[lane.number] = ([self.memory.offset(pieces[f"{name}.state"]) for name in names],
                                         [self.memory.offset(pieces[f"{name}.conv_tail"]) for name in names])

    def close(self, lane: Lane) -> None:
        """Give the lane's pages back (again: nothing)."""
        if lane.lease is not None:
            lane.lease.finish()
        lane.lease, lane.memory = None, None
        self.offsets.pop(lane.number, None)

    def _step(self, batch: DecodeBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Hidden rows, fp32 logits and each lane's plain keyed draw: what a decode graph captures."""
        assert self.memory is not None
        hidden = self.model.decode(batch, self.memory)
        logits = self.model.logits(hidden).float()
        return hidden, logits, draw(logits, batch.temperature, batch.seeds, batch.positions + 1)

    def _decode(self, works: Sequence[Work]) -> tuple[torch.Tensor, ...]:
        """``_step`` for decode works, all lanes in one batched step (a graph when captured)."""
        columns = []
        for work in works:
            lane = work.lane
            assert lane.lease is not None
            state_at, tail_at = self.offsets[lane.number]
            columns.append(self.columns.column(lane.generated[-1], work.start, lane.seed,
                                               lane.request.sampling.temperature, state_at, tail_at,
                                               lane.lease.row_pages, self.pool.null_page))
        batch = DecodeBatch.of(columns, self.columns, self.device)
        return self._step(batch) if self.graphs is None else self.graphs.run(batch.packed)

    def run(self, works: Sequence[Work]) -> list[Drawn]:
        """Run every work's rows (decode rows batched, prompt chunks as spans of one forward);
        draw a token for each work that samples."""
        for work in works:
            assert work.lane.lease is not None and work.lane.memory is not None
            work.lane.lease.take(work.start + work.length)
        batched = [work for work in works if work.decode and self.memory is not None]
        spanned = [work for work in works if not (work.decode and self.memory is not None)]
        drawing = [work for work in works if work.samples]
        with torch.no_grad():
            parts, where, plain_tokens = [], {}, None
            if batched:
                _, logits, plain_tokens = self._decode(batched)
                parts.append(logits)
                where = {id(work): i for i, work in enumerate(batched)}
            if spanned:
                hidden = self.model.forward([self._span(work) for work in spanned], self.rows).hidden
                ends: list[int] = []
                at = -1
                for work in spanned:
                    at += work.length
                    if work.samples:
                        where[id(work)] = len(batched) + len(ends)
                        ends.append(at)  # the work's last row
                if ends:
                    parts.append(self.model.logits(hidden[self._indices(ends)]).float())
            if not drawing:
                return []
            lanes = [work.lane for work in drawing]
            asked = [lane.request.sampling.logprobs for lane in lanes]
            logits = parts[0] if len(parts) == 1 else torch.cat(parts)
            only_decode = [id(work) for work in drawing] == [id(work) for work in batched]
            if not only_decode:
                logits = logits[self._indices([where[id(work)] for work in drawing])]
            if plain_tokens is not None and only_decode and all(plain(lane.request.sampling)
                                                                for lane in lanes):
                tokens = plain_tokens  # the draw the step already made, the same bits as ``sample``
            else:
                tokens = sample(logits, Rows.of([lane.request.sampling for lane in lanes],
                                                [lane.seed for lane in lanes],
                                                [lane.next_position for lane in lanes], self.device))
            details: list[TokenLogprob | None] = [None] * len(lanes)
            if any(n is not None for n in asked):
                top = max(n or 0 for n in asked)
                for i, entry in enumerate(logprobs(logits, tokens, top)):
                    n = asked[i]
                    if n is not None:
                        details[i] = attrs.evolve(entry, top=entry.top[:n])
            drawn = tokens.tolist()  # the step's one sync with the host
        return [Drawn(work, token, detail)
                for work, token, detail in zip(drawing, drawn, details, strict=True)]

    def _indices(self, values: list[int]) -> torch.Tensor:
        """Row indices on the device, copied without waiting for the queued work on CUDA."""
        return to_device(torch.tensor(values, dtype=torch.int64), self.device)

    def _span(self, work: Work) -> Span:
        lane = work.lane
        assert lane.memory is not None
        ids = [lane.generated[-1]] if work.decode else \
            lane.request.prompt[work.start:work.start + work.length]
        return Span(lane.memory, work.start, torch.tensor(ids, dtype=torch.long, device=self.device),
                    decode=work.decode)

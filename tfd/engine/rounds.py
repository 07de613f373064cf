"""Verify rounds: a step's drafting lanes verify their windows, keep what serial decoding would draw,
commit it, and get their next drafts.

A drafting lane's decode work is a window: its pending token (the last one drawn) and its drafts.
All windows of a step go through one verify pass (``HybridModel.verify``), ``rows`` rows a lane
(the widest window; a narrower lane's extra rows are padding rows that touch no memory). Every real
row is drawn with the keyed sampler at its own position, so row i draws what serial decoding draws
there whenever the rows before it are serial; ``drafts.kept`` says how many rows hold. The host
reads the draws (the round's one sync), the lanes commit their kept rows on the device, and the MTP
head absorbs the kept rows and chains the next drafts (``proposer.HeadProposer``). A lane's tokens
are therefore the serial tokens whatever the drafts; drafts only change how many a round yields.

A drafting lane's prompt chunks are absorbed by the head as they run (``absorb_prompt``); its first
drafts come with its first token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import torch

from tfd.engine.drafts import kept
from tfd.engine.lane import Lane
from tfd.engine.proposer import Absorb
from tfd.engine.request import TokenLogprob
from tfd.engine.sampling import Rows, logprobs, sample
from tfd.engine.scheduler import Work
from tfd.families.hybrid import HybridModel
from tfd.model.decode import Columns, DecodeBatch, DecodeMemory
from tfd.model.memory import ints_on
from tfd.model.verify import VerifyLanes

Propose = Callable[[Sequence[Absorb]], list[list[int]]]


@attrs.frozen
class Round:
    """What a lane's window gave: the kept draws (one a kept row), their logprobs when asked, and
    its next drafts."""

    tokens: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None
    drafts: tuple[int, ...]


def drafts_from_head(model: HybridModel) -> bool:
    """Whether ``model`` drafts: it has an MTP head and a stack verify windows run (one residual
    stream: Qwen3.5, Qwen3-Next)."""
    return model.head is not None and model.cfg.streams == 1 and model.batches_decode


def draft_count(lane: Lane, most: int, emitted: int = 0) -> int:
    """Drafts a lane may take next round after ``emitted`` more tokens: at most ``most``, and never
    a row past its window or a token past its ``max_tokens`` (the round's last draw is free)."""
    left = lane.request.max_tokens - len(lane.generated) - emitted
    return max(0, min(most, left - 1))


class Rounds:
    """The runner's verify rounds for ``model`` over ``memory``; ``offsets`` maps a lane number to
    its decode offsets; ``propose`` gives drafts (``HeadProposer.propose``); ``most``: drafts a
    round at most."""

    def __init__(self, model: HybridModel, memory: DecodeMemory, columns: Columns, null_page: int,
                 offsets: dict[int, list[int]], propose: Propose, most: int) -> None:
        self.model = model
        self.memory = memory
        self.columns = columns
        self.null_page = null_page
        self.offsets = offsets
        self.propose = propose
        self.most = most
        self.gdn_names = model.gdn_layers().layers
        self.device = memory.pool.buffer.device

    def run(self, works: Sequence[Work]) -> list[Round]:
        """Verify every work's window (``work.lane.drafts`` after its pending token), keep, commit,
        and draft again; a round per work, in order."""
        rows = max(work.length for work in works)
        columns, offsets, settings, seeds, positions, real = [], [], [], [], [], []
        for index, work in enumerate(works):
            lane = work.lane
            assert lane.lease is not None and lane.memory is not None
            window = [lane.generated[-1], *lane.drafts]
            if len(window) != work.length:
                raise RuntimeError(f"request {lane.request.id}: a window of {work.length} rows, "
                                   f"{len(window)} tokens to verify")
            for i in range(rows):
                if i < len(window):
                    columns.append(self.columns.column(window[i], work.start + i, lane.seed,
                                                       lane.request.sampling.temperature, -1,
                                                       self.offsets[lane.number], lane.lease.row_pages,
                                                       self.null_page))
                    settings.append(lane.request.sampling)
                    seeds.append(lane.seed)
                    positions.append(lane.next_position + i)
                    real.append(index * rows + i)
                else:
                    columns.append(self.columns.padding(self.null_page))
            offsets.append(VerifyLanes.lane_offsets(lane.memory.pieces, self.gdn_names,
                                                    self.memory.pool.buffer))
        batch = DecodeBatch.of(columns, self.columns, self.device)
        lanes = VerifyLanes.of(rows, offsets, self.device)
        hidden = self.model.verify(batch, self.memory, lanes)
        logits = self.model.logits(hidden[ints_on(real, self.device)]).float()
        drawn = sample(logits, Rows.of(settings, seeds, positions, self.device))
        asked = [work.lane.request.sampling.logprobs for work in works]
        details = None
        if any(n is not None for n in asked):
            details = logprobs(logits, drawn, max(n or 0 for n in asked))
        tokens = drawn.tolist()  # the round's one sync with the host
        rounds, keep, absorbs, owners, at = [], [], [], [], 0
        for index, work in enumerate(works):
            lane = work.lane
            assert lane.memory is not None
            sampled = tokens[at:at + work.length]
            count = kept(lane.drafts, sampled, lane.request.stop_ids)
            count = min(count, lane.request.max_tokens - len(lane.generated))
            keep.append(count)
            ends = any(token in lane.request.stop_ids for token in sampled[:count]) or \
                len(lane.generated) + count >= lane.request.max_tokens
            if not ends:  # the kept rows into the head, and the next drafts from the last
                start = index * rows
                absorbs.append(Absorb(lane.memory, work.start, hidden[start:start + count], sampled[:count],
                                      draft_count(lane, self.most, count)))
                owners.append(index)
            entries = None
            if asked[index] is not None and details is not None:
                entries = tuple(attrs.evolve(entry, top=entry.top[:asked[index]])
                                for entry in details[at:at + count])
            rounds.append(Round(tuple(sampled[:count]), entries, ()))
            at += work.length
        self.model.commit(batch, self.memory, lanes, ints_on(keep, self.device, torch.int32))
        drafted = self.propose(absorbs) if absorbs else []
        for index, more in zip(owners, drafted, strict=True):
            rounds[index] = attrs.evolve(rounds[index], drafts=tuple(more))
        return rounds

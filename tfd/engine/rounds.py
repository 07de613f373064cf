"""Verify rounds: a step's drafting lanes verify their windows, keep what serial decoding would draw,
commit it, and get their next drafts.

A drafting lane's decode work is a window: its pending token (the last one drawn) and its drafts.
All windows of a step go through one verify pass (``HybridModel.verify``), ``rows`` rows a lane (the
widest window, or every lane's most when captured; a narrower lane's extra rows are padding rows
that touch no memory). Every row draws with the keyed sampler at its own position, so row i draws
what serial decoding draws there whenever the rows before it are serial. On the device, then: how
many rows each lane keeps (its pending row, and each draft while it equals the token drawn before
it: ``drafts.kept`` without the stop tokens), the commit of the kept rows, the MTP head's cells over
the window fed the drawn tokens, and the chain of next drafts from the last kept row
(``proposer.chain``). The host reads the draws, the counts and the drafts once; it ends a lane's
tokens at a stop token or ``max_tokens`` (the rows kept past them are never read: the lane ends).
A lane's tokens are therefore the serial tokens whatever the drafts; drafts only change how many a
round yields.

A round whose rows all draw plainly (no top-k/p, min-p or logprobs) is one replay of a captured
graph when the runner has graphs (``graphs.RoundGraphs``); otherwise the same functions run eagerly,
the draw through ``sampling.sample``. A drafting lane's prompt chunks are absorbed by the head as
they run (``absorb``); its first drafts come with its first token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import torch

from tfd.engine.graphs import RoundGraphs
from tfd.engine.lane import Lane
from tfd.engine.proposer import Absorb, HeadProposer, chain
from tfd.engine.request import TokenLogprob
from tfd.engine.sampling import Rows, draw, logprobs, plain, sample
from tfd.engine.scheduler import Work
from tfd.families.hybrid import HybridModel
from tfd.model.decode import Columns, DecodeBatch, DecodeMemory
from tfd.model.memory import PageRows
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


def ended(lane: Lane, tokens: Sequence[int]) -> tuple[tuple[int, ...], bool]:
    """A round's kept draws as the lane emits them (up to and with a stop token, at most its
    ``max_tokens``), and whether they end it."""
    left = lane.request.max_tokens - len(lane.generated)
    for at, token in enumerate(tokens[:left]):
        if token in lane.request.stop_ids:
            return tuple(tokens[:at + 1]), True
    return tuple(tokens[:left]), len(tokens) >= left


class Rounds:
    """The runner's verify rounds for ``model`` over ``memory``; ``offsets`` maps a lane number to
    its decode offsets; ``most`` drafts a round at most, chained while at least ``confidence`` likely;
    ``propose`` replaces the head's drafts (a scripted head in tests); ``graphs``: capture rounds
    (CUDA) for up to ``max_lanes`` lanes."""

    def __init__(self, model: HybridModel, memory: DecodeMemory, rows: PageRows, columns: Columns,
                 offsets: dict[int, list[int]], most: int, confidence: float,
                 propose: Propose | None = None, graphs: bool = False, max_lanes: int = 1) -> None:
        self.model = model
        self.memory = memory
        self.columns = columns
        self.null_page = rows.null_page
        self.offsets = offsets
        self.verify_offsets: dict[int, list[int]] = {}  # lane number: its verify offsets
        self.most = most
        self.confidence = confidence
        self.head = HeadProposer(model, rows, memory, columns, confidence)
        self.propose = propose
        self.gdn_names = model.gdn_layers().layers
        self.device = memory.pool.buffer.device
        self.graphs: RoundGraphs | None = None
        if graphs and self.device.type == "cuda":
            self.graphs = RoundGraphs(self._step, columns, self.null_page, VerifyLanes.padding(
                len(self.gdn_names)), max_lanes, most + 1, self.device)

    def lane_offsets(self, lane: Lane) -> list[int]:
        """A lane's verify offsets (``VerifyLanes.lane_offsets``), worked out once while it is open:
        a round's host work stands between two rounds' device work."""
        found = self.verify_offsets.get(lane.number)
        if found is None:
            assert lane.memory is not None
            found = self.verify_offsets[lane.number] = VerifyLanes.lane_offsets(
                lane.memory.pieces, self.gdn_names, self.memory.pool.buffer)
        return found

    def forget(self, lane: Lane) -> None:
        """A closed lane's offsets go (its pieces may move to another lane of that number)."""
        self.verify_offsets.pop(lane.number, None)

    def absorb(self, absorbs: Sequence[Absorb]) -> list[list[int]]:
        """Prompt rows into the head, and the first drafts of lanes whose prompt ended."""
        return self.propose(absorbs) if self.propose is not None else self.head.absorb(absorbs)

    def run(self, works: Sequence[Work]) -> list[Round]:
        """Verify every work's window (``work.lane.drafts`` after its pending token), keep, commit,
        and draft again; a round per work, in order."""
        drawing_plain = all(plain(work.lane.request.sampling) and work.lane.request.sampling.logprobs is None
                            for work in works)
        captured = self.graphs is not None and drawing_plain
        rows = self.most + 1 if captured else max(work.length for work in works)
        columns, offsets, settings, seeds, positions = [], [], [], [], []
        for work in works:
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
                else:
                    columns.append(self.columns.padding(self.null_page))
                settings.append(lane.request.sampling)
                seeds.append(lane.seed)
                positions.append(lane.next_position + i)
            offsets.append(self.lane_offsets(lane))
        details = None
        if captured:
            assert self.graphs is not None
            out = self.graphs.run(columns, offsets)
        else:
            batch = DecodeBatch.of(columns, self.columns, self.device)
            lanes = VerifyLanes.of(rows, offsets, self.device)
            hidden, logits = self._verify(batch, lanes)
            if drawing_plain:
                drawn = draw(logits, batch.temperature_bits, batch.seeds, batch.positions, 1)
            else:
                drawn = sample(logits.float(), Rows.of(settings, seeds, positions, self.device))
            asked = [work.lane.request.sampling.logprobs for work in works]
            if any(n is not None for n in asked):
                details = logprobs(logits, drawn, max(n or 0 for n in asked))
            out = self._settle(batch, lanes, hidden, drawn)
        return self._rounds(works, rows, out.tolist(), details)  # the round's one sync with the host

    def _rounds(self, works: Sequence[Work], rows: int, out: list[list[int]],
                details: list[TokenLogprob] | None) -> list[Round]:
        """Each work's round from the host's copy of ``_settle``'s output."""
        found, absorbs, owners = [], [], []
        for index, (work, row) in enumerate(zip(works, out, strict=True)):
            lane = work.lane
            tokens, ends = ended(lane, row[:row[rows]])
            entries = None
            asked = lane.request.sampling.logprobs
            if asked is not None and details is not None:
                at = index * rows
                entries = tuple(attrs.evolve(entry, top=entry.top[:asked])
                                for entry in details[at:at + len(tokens)])
            wanted = 0 if ends else draft_count(lane, self.most, len(tokens))
            drafts = row[rows + 1:rows + 1 + min(wanted, row[-1])]
            if self.propose is not None and not ends:
                assert lane.memory is not None
                # a scripted head reads tokens only: the main model's rows stay on the device
                absorbs.append(Absorb(lane.memory, work.start, torch.empty(0), tokens, wanted))
                owners.append(index)
            found.append(Round(tokens, entries, tuple(drafts)))
        if absorbs:
            assert self.propose is not None
            for index, more in zip(owners, self.propose(absorbs), strict=True):
                found[index] = attrs.evolve(found[index], drafts=tuple(more))
        return found

    def _verify(self, batch: DecodeBatch, lanes: VerifyLanes) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row's final hidden row and logits; the lanes' states stay committed."""
        hidden = self.model.verify(batch, self.memory, lanes)
        return hidden, self.model.logits(hidden)

    def _step(self, batch: DecodeBatch, lanes: VerifyLanes) -> torch.Tensor:
        """A round whose rows draw plainly, all on the device: what ``RoundGraphs`` captures."""
        hidden, logits = self._verify(batch, lanes)
        return self._settle(batch, lanes, hidden, draw(logits, batch.temperature_bits, batch.seeds,
                                                      batch.positions, 1))

    def _settle(self, batch: DecodeBatch, lanes: VerifyLanes, hidden: torch.Tensor, drawn: torch.Tensor
                ) -> torch.Tensor:
        """After the draws (``drawn`` [lanes * rows]): each lane's kept rows counted and committed,
        the head's cells over its window, the next drafts chained from the last kept row. Returns
        [lanes, rows + 2 + most] int64: the draws, the kept count, the drafts, how many to propose."""
        count, rows = lanes.lanes, lanes.rows
        drawn = drawn.view(count, rows)
        tokens = batch.tokens.view(count, rows)
        real = (batch.lengths > 0).view(count, rows)
        holds = (tokens[:, 1:] == drawn[:, :-1]) & real[:, 1:]
        keep = 1 + holds.long().cumprod(dim=1).sum(dim=1)
        self.model.commit(batch, self.memory, lanes, keep.int())
        fed = batch.packed.clone()
        fed[0] = drawn.flatten()  # each row's cell takes the token drawn after it
        cells = self.model.draft_rows(DecodeBatch(fed, self.columns), self.memory, hidden)
        last = torch.arange(count, device=keep.device) * rows + keep - 1
        found = chain(self.model, self.memory, DecodeBatch(fed[:, last], self.columns), cells.hidden[last],
                      cells.carry[last], self.most, self.confidence)
        return torch.cat((drawn, keep[:, None], found.drafts, found.proposed[:, None]), dim=1)


def prompt_absorbs(works: Sequence[Work], rows: torch.Tensor, drawn: dict[int, int], most: int
                   ) -> tuple[list[Absorb], list[Work]]:
    """Drafting lanes' prompt chunks among ``works`` (spanned, in order; ``rows`` the head's input
    for all their rows), each row with the token after it (the prompt's, or for a prompt's last row
    the token ``drawn`` for its work); and the works they came from."""
    absorbs, owners, at = [], [], 0
    for work in works:
        lane = work.lane
        if lane.drafting and not work.decode and lane.memory is not None:
            follow = list(lane.request.prompt[work.start + 1:work.start + work.length + 1])
            wanted = 0
            if work.samples:  # the prompt's last row: the token after it is the one drawn now
                token = drawn[id(work)]
                follow.append(token)
                wanted = 0 if token in lane.request.stop_ids else draft_count(lane, most, 1)
            absorbs.append(Absorb(lane.memory, work.start, rows[at:at + work.length], follow, wanted))
            owners.append(work)
        at += work.length
    return absorbs, owners


"""Verify rounds: a step's drafting lanes verify their windows, keep what serial decoding would draw,
commit it, and get their next drafts.

A drafting lane's decode work is a window: its pending token (the last one drawn) and its drafts.
All windows of a step go through one verify pass (``HybridModel.verify``), ``rows`` rows a lane
(``most + 1``, or the widest window for a round that runs eagerly; a narrower lane's extra rows are
padding rows that touch no memory). Every row draws with the keyed sampler at its own position, so row i draws
what serial decoding draws there whenever the rows before it are serial. On the device, then: how
many rows each lane keeps (its pending row, and each draft while it equals the token drawn before
it: ``drafts.kept`` without the stop tokens), the commit of the kept rows, the MTP head's cells over
the window fed the drawn tokens, and the chain of next drafts from the last kept row
(``proposer.chain``), and the next round's inputs (``round_step``). The host reads the draws, the
counts and the drafts once; it ends a lane's
tokens at a stop token or ``max_tokens`` (the rows kept past them are never read: the lane ends).
A lane's tokens are therefore the serial tokens whatever the drafts; drafts only change how many a
round yields.

A round whose rows all draw plainly (no top-k/p, min-p or logprobs) is one replay of a captured
graph when the runner has graphs (``graphs.RoundGraphs``), or ``RoundStep.step`` run eagerly, and
the next one runs ahead (``Rounds``); otherwise the pieces run eagerly, the draw through
``sampling.sample``. A drafting lane's prompt chunks are absorbed by the head as
they run (``absorb``); its first drafts come with its first token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import torch

from tfd.engine import grammar_masks
from tfd.engine.graphs import RoundGraphs
from tfd.engine.lane import Lane
from tfd.engine.proposer import Absorb, HeadProposer
from tfd.engine.request import TokenLogprob
from tfd.engine.round_step import RoundInputs, RoundStep, host_inputs
from tfd.engine.sampling import Rows, logprobs, sample
from tfd.engine.scheduler import Work
from tfd.families.hybrid import HybridModel
from tfd.model.decode import DecodeMemory
from tfd.model.decode_batch import Columns, DecodeBatch
from tfd.model.memory import PageRows, to_host
from tfd.model.verify import VerifyLanes
from tfd_kernels import round_columns

Propose = Callable[[Sequence[Absorb]], list[list[int]]]


@attrs.frozen
class Round:
    """What a lane's window gave: the kept draws (one a kept row), their logprobs when asked, and
    its next drafts."""

    tokens: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None
    drafts: tuple[int, ...]


def drafts_from_head(model: HybridModel) -> bool:
    """Whether ``model`` drafts: it has an MTP head and its decode rows run batched (verify windows
    are batched decode rows)."""
    return model.head is not None and model.batches_decode


def draft_count(lane: Lane, most: int, emitted: int = 0) -> int:
    """Drafts a lane may take next round after ``emitted`` more tokens: at most ``most``, and never
    a row past its window or a token past its ``max_tokens`` (the round's last draw is free)."""
    return max(0, min(most, lane.tokens_left - emitted - 1))


@attrs.define
class _Launched:
    """A round in flight: its lanes in order, its output on its way to the host, and (for a round run
    ahead, once the round before is read) the first row each lane's window starts at."""

    lanes: tuple[Lane, ...]
    host: torch.Tensor
    copied: torch.cuda.Event | None  # recorded after the copy to the host (CUDA)
    starts: tuple[int, ...] = ()

    def read(self) -> list[list[int]]:
        """The output, waiting for its copy: the round's one sync with the host."""
        if self.copied is not None:
            self.copied.synchronize()
        return list(self.host.tolist())

    def check(self, works: Sequence[Work]) -> None:
        """RuntimeError for a work whose plan is not the round that ran ahead for its lane: its state
        is past the rows that round verified."""
        starts = {id(lane): start for lane, start in zip(self.lanes, self.starts, strict=True)}
        for work in works:
            if starts[id(work.lane)] != work.start:
                raise RuntimeError(f"request {work.lane.request.id}: the round run ahead started at row "
                                   f"{starts[id(work.lane)]}, the plan asks for rows from {work.start}")


class Rounds:
    """The runner's verify rounds for ``model`` over ``memory`` (a lane's offsets: its own, noted at
    open); ``most`` drafts a round at most, chained while at least ``confidence`` likely;
    ``propose`` replaces the head's drafts (a scripted head in tests); ``graphs``: capture rounds
    (CUDA) for up to ``max_lanes`` lanes.

    Rounds run one ahead, as decode steps do: when a step's windows all draw plainly, the next round
    of the same lanes is launched on the inputs this one advanced to before the host reads this one,
    so the host's bookkeeping overlaps the device's work. A lane that stops meanwhile wasted a round
    in its own pages. A cut draw, logprobs or a scripted head's drafts need the host between rounds."""

    def __init__(self, model: HybridModel, memory: DecodeMemory, rows: PageRows, columns: Columns,
                 most: int, confidence: float,
                 propose: Propose | None = None, graphs: bool = False, max_lanes: int = 1) -> None:
        self.model = model
        self.memory = memory
        self.columns = columns
        self.null_page = rows.null_page
        self.most = most
        self.head = HeadProposer(model, rows, memory, columns, confidence)
        self.propose = propose
        self.gdn_names = model.gdn_layers().layers
        self.device = memory.pool.buffer.device
        self.step = RoundStep(model, memory, columns, self.null_page, most, confidence)
        self.graphs: RoundGraphs | None = None
        if graphs and self.device.type == "cuda":
            self.graphs = RoundGraphs(self.step.step, columns, self.null_page, VerifyLanes.padding(
                len(self.gdn_names), self.step.ple), max_lanes, most + 1, columns.pages, self.device)
        self.inputs: RoundInputs | None = None  # an eager round's inputs, advanced to the next one's
        self.ahead: _Launched | None = None

    def absorb(self, absorbs: Sequence[Absorb]) -> list[list[int]]:
        """Prompt rows into the head, and the first drafts of lanes whose prompt ended."""
        return self.propose(absorbs) if self.propose is not None else self.head.absorb(absorbs)

    def run(self, works: Sequence[Work]) -> list[Round]:
        """Verify every work's window (``work.lane.drafts`` after its pending token), keep, commit,
        and draft again; a round per work, in order."""
        drawing_plain = all(work.lane.draws_alone for work in works)
        ahead, self.ahead = self.ahead, None
        if ahead is not None:
            same = [id(work.lane) for work in works] == list(map(id, ahead.lanes))
            if drawing_plain and self.propose is None and same:
                ahead.check(works)
                self.ahead = self._launch(works, fresh=False)  # the next round, before this one is read
                return self._read(works, ahead)
            return self._drain(ahead, works)
        if not drawing_plain:
            return self._eager(works)
        current = self._launch(works, fresh=True)
        if self.propose is None:
            self.ahead = self._launch(works, fresh=False)
        return self._read(works, current)

    def _read(self, works: Sequence[Work], launched: _Launched) -> list[Round]:
        """``launched``'s rounds; the round run ahead of it learns where its lanes start."""
        out = launched.read()
        if self.ahead is not None:
            self.ahead.starts = tuple(work.start + row[self.most + 1]
                                      for work, row in zip(works, out, strict=True))
        return self._rounds(works, self.most + 1, out, None)

    def _drain(self, ahead: _Launched, works: Sequence[Work]) -> list[Round]:
        """The plan changed under a round run ahead (a lane ended or joined, a draw that cuts): its
        lanes that go on take its rounds; the others run one now, with none ahead."""
        rows = dict(zip(map(id, ahead.lanes), ahead.read(), strict=True))
        covered = [work for work in works if id(work.lane) in rows]
        rest = [work for work in works if id(work.lane) not in rows]
        ahead.check(covered)
        found = dict(zip(map(id, covered), self._rounds(covered, self.most + 1,
                                                        [rows[id(work.lane)] for work in covered], None),
                         strict=True))
        if rest:
            drawing_plain = all(work.lane.draws_alone for work in rest)
            fresh = self._read(rest, self._launch(rest, fresh=True)) if drawing_plain else self._eager(rest)
            found.update(zip(map(id, rest), fresh, strict=True))
        return [found[id(work)] for work in works]

    def _launch(self, works: Sequence[Work], fresh: bool) -> _Launched:
        """Launch a round of ``works``' lanes (a graph replay when captured) and the copy of its output
        to the host: ``fresh``, on the windows the host plans (``_columns``); otherwise on the inputs
        the last round advanced to, with the lanes' page tables as they are now."""
        lanes = [work.lane for work in works]
        tables, limits = [], []
        for lane in lanes:
            assert lane.lease is not None
            pages = lane.lease.row_pages
            tables.append([*pages, *[self.null_page] * (self.columns.pages - len(pages))])
            limits.append(lane.prompt_length + lane.request.max_tokens - 2)
        columns, offsets = self._columns(works, self.most + 1) if fresh else (None, None)
        if self.graphs is not None:
            bucket = self.graphs.bucket(len(lanes))
            out = self.graphs.run(len(lanes), self.graphs.padded(columns, offsets, tables, limits, bucket))
        else:
            held = host_inputs(columns, offsets, tables, limits)
            if fresh or self.inputs is None:
                self.inputs = RoundInputs.of(held, self.device)
            else:
                self.inputs.copy_(held)
            out = self.step.step(self.inputs)
        if self.device.type != "cuda":
            return _Launched(tuple(lanes), out, None)
        # on the round's stream, in order: a later replay cannot overwrite the output first
        return _Launched(tuple(lanes), *to_host(out))

    def _columns(self, works: Sequence[Work], rows: int) -> tuple[list[list[int]], list[list[int]]]:
        """Each work's window as ``rows`` columns (padding rows after it), and each lane's verify
        offsets. RuntimeError for a work whose length is not its lane's window."""
        columns, offsets = [], []
        for work in works:
            lane = work.lane
            assert lane.lease is not None
            window = [lane.generated[-1], *lane.drafts]
            if len(window) != work.length:
                raise RuntimeError(f"request {lane.request.id}: a window of {work.length} rows, "
                                   f"{len(window)} tokens to verify")
            for i in range(rows):
                if i < len(window):
                    columns.append(self.columns.column(window[i], work.start + i, lane.seed,
                                                       lane.request.sampling.temperature, -1,
                                                       lane.offsets, lane.lease.row_pages,
                                                       self.null_page))
                else:
                    columns.append(self.columns.padding(self.null_page))
            offsets.append(list(lane.verify_offsets))
        return columns, offsets

    def _eager(self, works: Sequence[Work]) -> list[Round]:
        """A round that cuts its draws or reports logprobs: its pieces run eagerly, the draw through
        ``sampling.sample``, the widest window's rows a lane."""
        rows = max(work.length for work in works)
        columns, offsets = self._columns(works, rows)
        settings, seeds, positions, histories = [], [], [], []
        for work in works:
            lane = work.lane
            settings += [lane.sampling_at(len(lane.generated) + i) for i in range(rows)]
            seeds += [lane.seed] * rows
            positions += [lane.next_position + i for i in range(rows)]
            histories += [lane.history(lane.drafts[:i]) for i in range(rows)]  # as if its drafts before held
        batch = DecodeBatch.of(columns, self.columns, self.device)
        lanes = VerifyLanes.of(rows, offsets, self.device, self.step.ple)
        previous, logits = self.step.verify(batch, lanes)
        # a lane's rows follow its grammar as if its drafts before them held (filled as the device runs)
        follows = [(work.lane.grammar, at * rows, work.lane.drafts[:rows - 1])
                   for at, work in enumerate(works) if work.lane.grammar is not None]
        allowed = grammar_masks.allowed(len(works) * rows, follows) if follows else None
        drawn = sample(logits, Rows.of(settings, seeds, positions, self.device, histories, allowed))
        asked = [work.lane.request.sampling.logprobs for work in works]
        details = logprobs(logits, drawn, max(n or 0 for n in asked)) if any(n is not None for n in asked) \
            else None
        kept, found = self.step.settle(batch, lanes, previous, drawn)
        out = round_columns.reference_output(batch.packed, drawn, kept, found.drafts, found.proposed)
        return self._rounds(works, rows, out.tolist(), details)

    def _rounds(self, works: Sequence[Work], rows: int, out: Sequence[Sequence[int]],
                details: list[TokenLogprob] | None) -> list[Round]:
        """Each work's round from the host's copy of a round's output (``RoundStep.step``'s).
        RuntimeError for a window the round verified that is not the work's."""
        found, absorbs, owners = [], [], []
        for index, (work, row) in enumerate(zip(works, out, strict=True)):
            lane = work.lane
            if row[-1] != work.length:
                raise RuntimeError(f"request {lane.request.id}: the round verified {row[-1]} rows, the plan "
                                   f"asks for {work.length}")
            tokens, ends = lane.emits(row[:row[rows]])
            entries = None
            asked = lane.request.sampling.logprobs
            if asked is not None and details is not None:
                at = index * rows
                entries = tuple(attrs.evolve(entry, top=entry.top[:asked])
                                for entry in details[at:at + len(tokens)])
            wanted = 0 if ends else draft_count(lane, self.most, len(tokens))
            drafts = row[rows + 1:rows + 1 + min(wanted, row[-2])]
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
                wanted = 0 if lane.stops_at(token) else draft_count(lane, most, 1)
            absorbs.append(Absorb(lane.memory, work.start, rows[at:at + work.length], follow, wanted,
                                  lane.seed, lane.request.sampling.temperature))
            owners.append(work)
        at += work.length
    return absorbs, owners


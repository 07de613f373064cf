"""The runner: owns the device side of lanes (leases, views) and runs a step's rows.

It opens an admitted lane (its state pieces on pages, zeroed or initialised by the model), takes
row pages as rows grow, runs the step's decode rows as one batched pass (``model.decode``, the head
and the plain keyed draw: a CUDA graph replay when captured) and its prompt chunks as one forward
over their spans, applies the head only to the rows that draw a token, and samples them on the
device with the keyed sampler (again over the decode rows' logits when a lane cuts top-k/p or
min-p, or when prompt rows draw too). Host-to-device copies go from pinned memory without waiting.
One host sync a step: the drawn tokens come back to Python for the scheduler's bookkeeping.
A batched decode step draws into a half of ``DecodeMemory.feed`` (the halves alternate step by step)
and its tokens go to the host from a side stream, so the copy does not hold up the next step (~9 us a
step on the H200); a step waits for the copy out of its half two steps before, long done by then.

Decoding runs one step ahead: when a step's rows are all plain decode rows (no top-k/p, min-p or
logprobs), the next step of its lanes is launched before the host waits for this one, its tokens
fed from this step's draw on the device (each lane's token field names its row of the draw, which
every decode step writes into ``DecodeMemory.feed``), so the host's bookkeeping overlaps the device's
work and nothing is copied between the two steps but the packed inputs. A
lane that then stops (a stop token, a cancel) wasted one row in its own pages, which it gives back
as usual; every other lane's rows are what the next plan asks for, the same bits as run then.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import attrs
import torch

from tfd.cache.kept import KeptStates
from tfd.cache.prompt_cache import PromptCache, Start
from tfd.engine.graphs import DecodeGraphs
from tfd.engine.lane import Lane
from tfd.engine.request import TokenLogprob
from tfd.engine.rounds import Propose, Rounds, drafts_from_head, prompt_absorbs
from tfd.engine.sampling import Rows, draw, draws_alone, logprobs, plain, sample
from tfd.engine.scheduler import Admission, Work
from tfd.families.hybrid import HybridModel
from tfd.model.decode import Columns, DecodeBatch, DecodeMemory
from tfd.model.memory import LaneMemory, PageRows, Span, ints_on, to_host
from tfd.model.stack import StackOutput
from tfd.pool.pages import Pool

log = logging.getLogger("tfd.engine")


@attrs.frozen
class Launched:
    """A batched decode step in flight: its lanes in column order, the row each runs, and the copy
    of its drawn tokens to the host."""

    lanes: tuple[Lane, ...]
    starts: tuple[int, ...]
    host_tokens: torch.Tensor
    copied: torch.cuda.Event | None  # recorded after the copy to the host (CUDA)
    first_row: int  # the feed row of its first lane's draw; the others follow in column order

    def tokens(self) -> list[int]:
        """The drawn tokens, waiting for their copy: the step's one sync with the host."""
        if self.copied is not None:
            self.copied.synchronize()
        return list(self.host_tokens.tolist())

    def ran(self, works: Sequence[Work]) -> list[bool]:
        """For each of ``works``, whether this step ran its row (its lane still open). Raises
        ``RuntimeError`` for a lane it ran asked for another row: its state is past that row."""
        starts = {id(lane): start for lane, start in zip(self.lanes, self.starts, strict=True)}
        found = []
        for work in works:
            start = starts.get(id(work.lane)) if work.lane.lease is not None else None
            if start is not None and (not work.decode or start != work.start):
                raise RuntimeError(f"request {work.lane.request.id}: the step run ahead ran row {start}, "
                                   f"the plan asks for rows from {work.start}")
            found.append(start is not None)
        return found


@attrs.frozen
class Drawn:
    """A work's drawn tokens (one; a verify round's kept draws, one a row it kept) and, when asked,
    their log-probabilities; a drafting lane's next drafts."""

    work: Work
    tokens: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None
    drafts: tuple[int, ...] = ()


@attrs.frozen
class Drafting:
    """Drafts from the MTP head: ``most`` a round, later ones while the one before is at least
    ``confidence`` likely; a lane drafts only when it is admitted with at most ``max_lanes`` lanes
    running or waiting (0: always)."""

    most: int
    confidence: float
    max_lanes: int = 0


def settle(works: Sequence[Work], drawn: Sequence[Drawn]) -> None:
    """After a step: each work's lane past the rows it ran (a verify round past those it kept), a
    drafting lane's next drafts and its draft counts."""
    for work in works:
        work.lane.advanced(work.start + work.length)
    for item in drawn:
        lane = item.work.lane
        if item.work.verify:
            lane.verified(item.work.start, item.work.length, len(item.tokens), item.drafts)
        elif lane.drafting:
            lane.drafted(item.drafts)


class Runner:
    """``context``: the most rows a lane may hold (the width of a decode step's page tables).
    ``graphs``: replay captured CUDA graphs for decode steps (CUDA only; captured here, at load).
    ``drafting``: lanes that ask for it verify drafts from the MTP head in rounds (a model with a
    head and one residual stream; the pool's layout with the head's rows and verify's buffers for
    windows of ``drafting.most + 1`` rows); ``propose`` replaces the head (a scripted one in tests).
    ``kept_bytes``: the prompt cache's budget in memory (``tfd.cache``; 0: no cache), ``keep_gain`` the
    tokens a resumed lane prefills before it keeps a state again."""

    def __init__(self, model: HybridModel, pool: Pool, context: int, max_lanes: int,
                 graphs: bool = False, drafting: Drafting | None = None,
                 propose: Propose | None = None, kept_bytes: int = 0, keep_gain: int = 0) -> None:
        self.model = model
        self.pool = pool
        self.rows = PageRows(pool)
        self.device = pool.buffer.device
        self.offsets: dict[int, list[int]] = {}  # lane number: its offset fields, in Columns order
        self.memory: DecodeMemory | None = None
        self.graphs: DecodeGraphs | None = None
        self.gdn_names = model.gdn_layers().layers
        self.columns = Columns(len(self.gdn_names), pool.layout.row_pages(context),
                               ple=model.ple_state() is not None)
        if model.batches_decode:
            self.memory = DecodeMemory(pool, model.dtype, max_lanes)
            if graphs and self.device.type == "cuda":
                self.graphs = DecodeGraphs(self._step, self.columns, pool.null_page, max_lanes, self.device)
        self.ahead: Launched | None = None  # the decode step launched before its plan
        self.parity = 0  # the feed half the next batched decode step draws into
        self.copies: list[torch.cuda.Event | None] = [None, None]  # each half's last copy to the host
        self.side = None if self.device.type != "cuda" else torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        self.rounds: Rounds | None = None
        self.drafting = drafting
        if drafting is not None and drafts_from_head(model) and self.memory is not None:
            self.rounds = Rounds(model, self.memory, self.rows, self.columns, self.offsets, drafting.most,
                                 drafting.confidence, propose, graphs, max_lanes)
        self.cache = PromptCache(KeptStates(pool, model.pieces(), kept_bytes, keep_gain), model.init_state) \
            if kept_bytes else None  # its disk tier attached once the identity is known

    def admit(self, lane: Lane, load: int = 1) -> Admission:
        """Admit a waiting lane if the pool can promise its window (evicting kept states that are in
        the way), resuming it from the longest kept state its prompt extends; ``load``: the lanes
        running or waiting. WAIT while the pool is short; DROPPED when opening it failed (logged;
        its pages are back)."""
        drafts = self.rounds is not None and lane.request.draft and self._drafts_at(load)
        begin = Start()
        if self.cache is None or not lane.request.cache:  # its prompt chunked as without a cache
            lane.keeps_nothing()
        else:
            begin = self.cache.choose(lane.prefixes, lane.request.window, drafts)
        if not self.pool.can_promise(lane.request.window, begin.adopted):
            return Admission.WAIT
        lane.promised(self.pool.promise(lane.request.window, begin.adopted))
        try:
            self.open(lane, drafts, begin)
        except Exception:
            log.exception("could not open a lane for request %s", lane.request.id)
            return Admission.DROPPED
        return Admission.ADMITTED

    def open(self, lane: Lane, drafts: bool, begin: Start | None = None) -> None:
        """Give an admitted lane (its lease promised) its state pieces, initialised, and start it
        where ``begin`` says (``PromptCache.start``); ``drafts``: it verifies drafts in rounds.

        Error handling: on failure the lease is finished, so the pool is as before.
        """
        lease = lane.lease
        assert lease is not None
        try:
            pieces = lease.open(self.model.init_state)
            memory = LaneMemory(pieces, lease.page_table)
            lane.opened(memory, drafts)
            if self.cache is not None and lane.request.cache:  # a bypass is neither a hit nor a miss
                at = self.cache.start(begin or Start(), lane.prefixes, lease, memory, drafts)
                lane.resumed(at, self.cache.passed(lane.keep_points, at))
        except BaseException:
            lease.finish()
            lane.open_failed()
            raise
        if self.memory is not None:
            self.offsets[lane.number] = self.memory.lane_offsets(pieces, self.gdn_names, self.columns.ple)

    def _drafts_at(self, load: int) -> bool:
        """Whether a lane admitted at ``load`` lanes drafts."""
        assert self.drafting is not None
        return not self.drafting.max_lanes or load <= self.drafting.max_lanes

    def close(self, lane: Lane) -> None:
        """Give the lane's pages back (again: nothing)."""
        if lane.lease is not None:
            lane.lease.finish()
        lane.released()
        self.offsets.pop(lane.number, None)
        if self.rounds is not None:
            self.rounds.forget(lane)

    def _step(self, batch: DecodeBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden rows and logits in the model dtype, and each lane's plain keyed draw (of their fp32
        values, at the next position) into the feed row its column names, which a later step's token
        fields may name: what a decode graph captures."""
        assert self.memory is not None
        hidden = self.model.decode(batch, self.memory)
        logits = self.model.logits(hidden)
        draw(logits, batch.temperature_bits, batch.seeds, batch.positions, 1, self.memory.feed,
             batch.draw_rows)
        return hidden, logits

    def _decode(self, works: Sequence[Work]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``_step`` for decode works, all lanes in one batched step (a graph when captured), and
        their draws."""
        (hidden, logits), drawn, _ = self._launch_step(*_decode_inputs(works))
        return hidden, logits, drawn

    def _launch_step(self, lanes: Sequence[Lane], starts: Sequence[int], tokens: Sequence[int]
                     ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, int]:
        """``_step`` for ``lanes`` at rows ``starts`` fed ``tokens``: token ids, or -(row + 1) for the
        token a decode step drew into that feed row (read on the device, the host not waiting). Its
        outputs, its draws (a view of the feed) and the feed half they are in."""
        assert self.memory is not None
        parity, self.parity = self.parity, self.parity ^ 1
        rows = self.memory.half(parity)
        copied = self.copies[parity]
        if copied is not None:  # the half's last copy to the host is done before this step draws over it
            torch.cuda.current_stream(self.device).wait_event(copied)
        columns = []
        for token, lane, start, row in zip(tokens, lanes, starts, rows[:len(lanes)], strict=True):
            assert lane.lease is not None
            columns.append(self.columns.column(token, start, lane.seed, lane.request.sampling.temperature,
                                               row, self.offsets[lane.number], lane.lease.row_pages,
                                               self.pool.null_page))
        if self.graphs is not None:
            outputs = self.graphs.run(columns)
        else:
            outputs = self._step(DecodeBatch.of(columns, self.columns, self.device))
        return outputs, self.memory.feed[rows.start:rows.start + len(lanes)], parity

    def _launch(self, lanes: Sequence[Lane], starts: Sequence[int], tokens: Sequence[int]) -> Launched:
        """Launch a plain decode step and the copy of its draw to the host (on the side stream, after
        the step); nothing waits."""
        _, drawn, parity = self._launch_step(lanes, starts, tokens)
        assert self.memory is not None
        first = self.memory.half(parity).start
        if self.side is None:
            return Launched(tuple(lanes), tuple(starts), drawn.clone(), None, first)
        stepped = torch.cuda.Event()  # type: ignore[no-untyped-call]
        stepped.record(torch.cuda.current_stream(self.device))
        self.side.wait_event(stepped)
        with torch.cuda.stream(self.side):
            host, copied = to_host(drawn)
        self.copies[parity] = copied
        return Launched(tuple(lanes), tuple(starts), host, copied, first)

    def _ahead_of(self, step: Launched, works: Sequence[Work]) -> Launched | None:
        """The step after ``step`` (the last decode step launched) for the lanes of ``works`` (rows
        ``step`` ran) that will want one: not cancelled, short of their ``max_tokens``. Fed ``step``'s
        draw on the device; None when no lane will."""
        at = {id(lane): i for i, lane in enumerate(step.lanes)}
        going = [work for work in works if not work.lane.cancelled and work.lane.tokens_left > 1]
        if not going:
            return None
        lanes = [work.lane for work in going]
        starts = [work.start + 1 for work in going]
        for lane, start in zip(lanes, starts, strict=True):
            assert lane.lease is not None
            lane.lease.take(start + 1)
        return self._launch(lanes, starts, [-(step.first_row + at[id(lane)] + 1) for lane in lanes])

    def _plain_decode(self, works: Sequence[Work]) -> bool:
        """Whether ``works`` are batched decode rows whose draws the step itself makes."""
        return self.memory is not None and all(
            work.decode and work.samples and draws_alone(work.lane.request.sampling) for work in works)

    @torch.no_grad()
    def run(self, works: Sequence[Work]) -> list[Drawn]:
        """Run every work's rows (decode rows batched, prompt chunks as spans of one forward);
        draw a token for each work that samples. Rows the step run ahead already ran are not run
        again; a plain decode step launches the next one before it waits."""
        if self.cache is not None:
            self.cache.settle()
        for work in works:
            lease = work.lane.lease
            assert lease is not None and work.lane.memory is not None
            # a drafting lane's next round (run ahead) and its head's chained cells go past its rows:
            # their rows on its own pages
            chained = 2 * self.rounds.most + 1 if self.rounds is not None and work.lane.drafting else 0
            lease.take(work.start + work.length)
            if chained:
                lease.take(min(lease.window, work.start + work.length + chained))
        rounds = [work for work in works if work.verify]
        if rounds:  # drafting lanes' windows: a verify pass of their own
            assert self.rounds is not None
            verified = [Drawn(work, found.tokens, found.logprobs, found.drafts)
                        for work, found in zip(rounds, self.rounds.run(rounds), strict=True)]
            return verified + self.run([work for work in works if not work.verify])
        ahead, self.ahead = self.ahead, None
        ran = ahead.ran(works) if ahead is not None else [False] * len(works)
        covered = [work for work, done in zip(works, ran, strict=True) if done]
        rest = [work for work, done in zip(works, ran, strict=True) if not done]
        if ahead is not None and not rest:  # the whole step ran ahead: launch the next, then wait
            if self._plain_decode(covered):
                self.ahead = self._ahead_of(ahead, covered)
            return self._drawn(covered, ahead)
        if not covered and works and self._plain_decode(works):
            step = self._launch(*_decode_inputs(works))
            self.ahead = self._ahead_of(step, works)
            return self._drawn(works, step)
        drawn = self._run(rest)
        self._keep(rest)
        if ahead is None or not covered:
            return drawn
        return self._drawn(covered, ahead) + drawn

    def _keep(self, works: Sequence[Work]) -> None:
        """Keep the state of each lane whose prompt chunk just ended at one of its keep points."""
        if self.cache is None:
            return
        for work in works:
            lane, end = work.lane, work.start + work.length
            if not work.decode and end in lane.keep_points:
                assert lane.lease is not None and lane.memory is not None
                self.cache.keep(lane.prefixes, lane.lease, lane.memory, end, lane.drafting)

    @staticmethod
    def _drawn(works: Sequence[Work], step: Launched) -> list[Drawn]:
        """``works``' tokens from the decode step that ran their rows (it waits for them)."""
        tokens = step.tokens()
        where = {id(lane): i for i, lane in enumerate(step.lanes)}
        return [Drawn(work, (tokens[where[id(work.lane)]],), None) for work in works]

    def _run(self, works: Sequence[Work]) -> list[Drawn]:
        """Run ``works`` and wait for their draws (a step nothing runs ahead of)."""
        batched = [work for work in works if work.decode and self.memory is not None]
        spanned = [work for work in works if not (work.decode and self.memory is not None)]
        drawing = [work for work in works if work.samples]
        with torch.no_grad():
            parts, where, plain_tokens = [], {}, None
            if batched:
                _, logits, plain_tokens = self._decode(batched)
                parts.append(logits)
                where = {id(work): i for i, work in enumerate(batched)}
            output = None
            if spanned:
                output = self.model.forward([self._span(work) for work in spanned], self.rows)
                hidden = output.hidden
                ends: list[int] = []
                at = -1
                for work in spanned:
                    at += work.length
                    if work.samples:
                        where[id(work)] = len(batched) + len(ends)
                        ends.append(at)  # the work's last row
                if ends:
                    parts.append(self.model.logits(hidden[ints_on(ends, self.device)]))
            if not drawing:
                if output is not None:
                    self._absorb_prompts(spanned, output, {})
                return []
            lanes = [work.lane for work in drawing]
            asked = [lane.request.sampling.logprobs for lane in lanes]
            logits = parts[0] if len(parts) == 1 else torch.cat(parts)  # the model dtype: widened when cut
            only_decode = [id(work) for work in drawing] == [id(work) for work in batched]
            if not only_decode:
                logits = logits[ints_on([where[id(work)] for work in drawing], self.device)]
            if plain_tokens is not None and only_decode and all(plain(lane.request.sampling)
                                                                for lane in lanes):
                tokens = plain_tokens  # the draw the step already made, the same bits as ``sample``
            else:
                tokens = sample(logits.float(), Rows.of([lane.request.sampling for lane in lanes],
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
            drafts = {} if output is None else self._absorb_prompts(
                spanned, output, {id(work): token for work, token in zip(drawing, drawn, strict=True)})
        return [Drawn(work, (token,), None if entry is None else (entry,), drafts.get(id(work), ()))
                for work, token, entry in zip(drawing, drawn, details, strict=True)]

    def _absorb_prompts(self, spanned: Sequence[Work], output: StackOutput, drawn: dict[int, int]
                        ) -> dict[int, tuple[int, ...]]:
        """Drafting lanes' prompt rows of this step into the MTP head's cache, each row with the
        token after it (the prompt's, or for its last row the token ``drawn`` now); the first drafts
        of each lane whose prompt ended, by work."""
        if self.rounds is None:
            return {}
        absorbs, owners = prompt_absorbs(spanned, self.model.draft_input(output), drawn, self.rounds.most)
        found = self.rounds.absorb(absorbs) if absorbs else []
        return {id(work): tuple(more) for work, more in zip(owners, found, strict=True)}

    def _span(self, work: Work) -> Span:
        lane = work.lane
        assert lane.memory is not None
        ids = [lane.generated[-1]] if work.decode else \
            lane.request.prompt[work.start:work.start + work.length]
        return Span(lane.memory, work.start, ints_on(ids, self.device), decode=work.decode)


def _decode_inputs(works: Sequence[Work]) -> tuple[list[Lane], list[int], list[int]]:
    """Decode works' lanes, rows and tokens (each lane's last drawn token), for a launch."""
    lanes = [work.lane for work in works]
    return lanes, [work.start for work in works], [lane.generated[-1] for lane in lanes]

"""Batched decode steps on the device, plain ones launched one step ahead.

A batched decode step (``step``: the layers, the head and the plain keyed draw; a CUDA graph replay
when captured) draws into a half of ``DecodeMemory.feed`` (the halves alternate step by step) and
its tokens go to the host from a side stream, so the copy does not hold up the next step (~9 us a
step on the H200); a step waits for the copy out of its half two steps before, long done by then.

When a step's rows are all decode rows drawn by the step itself or on the host's path from what the
lanes know before it (a grammar's mask, a bias, penalties, cuts; not logprobs, not drafting lanes:
``ahead_able``), the next step of its lanes is launched before the host waits for this one
(``ahead``), its tokens fed from this step's draw on the device (each lane's token field names its
row of the draw), so the host's bookkeeping overlaps the device's work. A step whose lanes draw on
the host's path (``Launched.on_host``) has its draws made by ``drawn_on_host`` once the lanes took
the tokens before it, written over the step's own in its feed rows before the next step is launched.
Its grammars' masks begin filling on the grammar thread as soon as the lanes took those tokens
(``fill_ahead``), the next step is made ready on the host meanwhile (``go_on``), and when every
lane draws plainly but for its mask the step's keyed draw runs again over its rows with the masks
and the keys of its own inputs, no settings moved to the device. A lane that then stops (a stop
token, a cancel) wasted one row in its own pages, which it gives back as usual; every other lane's
rows are what the next plan asks for, the same bits as run then. Engine thread only.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import attrs
import numpy as np
import torch

from tfd.engine import grammar, grammar_masks
from tfd.engine.drawn import Drawn, host_draw
from tfd.engine.graphs import DecodeGraphs
from tfd.engine.lane import Lane
from tfd.engine.sampling import draw
from tfd.engine.scheduler import Work
from tfd.families.hybrid import HybridModel
from tfd.model.decode import DecodeMemory
from tfd.model.decode_batch import Columns, DecodeBatch
from tfd.model.memory import ints_on, to_device, to_host
from tfd.pool.pages import Lease


@attrs.frozen
class _Ready:
    """A decode step made ready on the host, not launched: its lanes, their rows, the feed half it
    draws into, and its inputs packed (each lane's ``Columns.column``, a column a lane)."""

    lanes: tuple[Lane, ...]
    starts: tuple[int, ...]
    parity: int
    packed: torch.Tensor  # host int64 [fields, lanes]: ``Columns.pack``'s, or ``DecodeGraphs.pack``'s


@attrs.frozen
class Launched:
    """A batched decode step in flight: its lanes in column order, the row each runs, and the copy
    of its drawn tokens to the host."""

    lanes: tuple[Lane, ...]
    starts: tuple[int, ...]
    host_tokens: torch.Tensor
    copied: torch.cuda.Event | None  # recorded after the copy to the host (CUDA)
    first_row: int  # the feed row of its first lane's draw; the others follow in column order
    logits: torch.Tensor | None = None  # its lanes' logits, for a draw on the host's path
    on_host: bool = False  # its lanes draw on the host's path (``drawn_on_host`` before its tokens)
    batch: DecodeBatch | None = None  # its inputs on the device (its draws' keys), for a masked redraw

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


class DecodePipeline:
    """Batched decode steps of ``model`` over ``memory`` (``columns``: a step's input layout);
    ``graphs``: replay CUDA graphs captured here, at load, for up to ``max_lanes`` lanes."""

    def __init__(self, model: HybridModel, memory: DecodeMemory, columns: Columns, null_page: int,
                 max_lanes: int, graphs: bool) -> None:
        self.model = model
        self.memory = memory
        self.columns = columns
        self.null_page = null_page
        self.device = memory.pool.buffer.device
        self.graphs: DecodeGraphs | None = None
        if graphs and self.device.type == "cuda":
            self.graphs = DecodeGraphs(self.step, columns, null_page, max_lanes, self.device, self._redraw,
                                       grammar.mask_words(model.cfg.vocab))
        self.ahead: Launched | None = None  # the step launched before its plan
        self.parity = 0  # the feed half the next step draws into
        self.copies: list[torch.cuda.Event | None] = [None, None]  # each half's last copy to the host
        # each lane's ``Columns.tail`` and what it was made of (``_tail``), dropped with the lane
        self.tails: weakref.WeakKeyDictionary[Lane, tuple[tuple[Lease, int, tuple[int, ...]], np.ndarray]] = \
            weakref.WeakKeyDictionary()
        self.side = None if self.device.type != "cuda" else torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]

    def step(self, batch: DecodeBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden rows and logits in the model dtype, and each lane's plain keyed draw (of their fp32
        values, at the next position) into the feed row its column names, which a later step's token
        fields may name: what a decode graph captures."""
        hidden = self.model.decode(batch, self.memory)
        logits = self.model.logits(hidden)
        self._draw(batch, logits)
        return hidden, logits

    def _draw(self, batch: DecodeBatch, logits: torch.Tensor, masks: torch.Tensor | None = None) -> None:
        """``batch``'s keyed draw of ``logits`` (each row at its next position; ``masks``: grammars')
        into the feed row each column names."""
        draw(logits, batch.temperature_bits, batch.seeds, batch.positions, 1, self.memory.feed,
             batch.draw_rows, allowed=masks)

    def _redraw(self, batch: DecodeBatch, outputs: tuple[torch.Tensor, ...], masks: torch.Tensor) -> None:
        """``step``'s keyed draw of ``batch`` again, its logits (``outputs``' second) masked by
        ``masks``, into the same feed rows: what a redraw graph captures."""
        self._draw(batch, outputs[1], masks)

    def plain(self, works: Sequence[Work]) -> bool:
        """Whether ``works`` are decode rows whose draws the step itself makes."""
        return all(work.decode and work.samples and work.lane.draws_alone for work in works)

    def ahead_able(self, works: Sequence[Work]) -> bool:
        """Whether ``works`` are decode rows a step may run ahead of: drawn by the step itself, or on
        the host's path from what the lanes know before it (a grammar's mask, a bias, penalties: not
        logprobs, which are read from the step's own logits on the host; not a drafting lane's)."""
        return all(work.decode and work.samples and not work.verify and not work.lane.drafting
                   and work.lane.request.sampling.logprobs is None for work in works)

    def fill_ahead(self, drawn: Sequence[Drawn] | None = None) -> bool:
        """Start filling the masks of the step run ahead's grammar lanes still open, rows as
        ``drawn_on_host`` asks for them, while the host goes on (``grammar_masks.fill_ahead``); whether a
        fill began. ``drawn`` (the step before it's tokens): the lanes have not taken them yet, so
        each grammar takes its lane's now (``Matcher.judge``) and the fill begins before the lanes'
        takes; a lane whose grammar cannot take it so is left to its take, and ``drawn_on_host``
        fills again; a lane its token stops has no row drawn again, and no mask. Without: the lanes
        took them."""
        step = self.ahead
        if step is None or not step.on_host:
            return False
        tokens = None if drawn is None else \
            {id(item.work.lane): item.tokens[-1] for item in drawn if len(item.tokens) == 1}
        follows = []
        for row, lane in enumerate(step.lanes):
            if lane.grammar is None or lane.lease is None or lane.cancelled:
                continue
            if tokens is not None:
                token = tokens.get(id(lane))
                if token is None or not lane.grammar.judge(token):
                    return False  # left to the takes, and to the fill after them
                if lane.stopped_by(token):
                    continue
            follows.append((lane.grammar, row, ()))
        if follows:
            grammar_masks.fill_ahead(len(step.lanes), follows)
        return bool(follows)

    def drawn_on_host(self, step: Launched, works: Sequence[Work]) -> Launched:
        """``step``'s draws for ``works``' lanes made on the host's path (the lanes took the tokens
        before it: their masks and histories are those of this row), written over the step's own in
        its feed rows, where the step after it reads them, and copied to the host: the step as it
        stands then. Nothing waits."""
        assert step.logits is not None and step.batch is not None
        at = {id(lane): i for i, lane in enumerate(step.lanes)}
        lanes = [work.lane for work in works]
        rows = [at[id(lane)] for lane in lanes]
        drawn = self.memory.feed[step.first_row:step.first_row + len(step.lanes)]
        if all(lane.keyed_plainly for lane in lanes):
            # the step's keyed draw again over all its rows, each grammar's row masked (another row
            # draws what the step drew), with the keys and feed rows of the step's own inputs
            follows = [(lane.grammar, row, ()) for lane, row in zip(lanes, rows, strict=True)
                       if lane.grammar is not None]
            if follows and self.graphs is not None:  # the step was the last replay: its redraw graph
                self.graphs.redraw(grammar_masks.allowed(len(step.lanes), follows))
            elif follows:  # without masks the draw again would be the step's own
                self._draw(step.batch, step.logits, to_device(grammar_masks.allowed(len(step.lanes), follows),
                                                              self.device))
        else:
            where = ints_on(rows, self.device)
            self.memory.feed.index_copy_(0, where + step.first_row,
                                         host_draw(lanes, step.logits[where], self.device))
        host, copied = self._copy_out(drawn, 0 if step.first_row < self.memory.half(1).start else 1)
        return attrs.evolve(step, host_tokens=host, copied=copied, on_host=False)

    def decode(self, works: Sequence[Work]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``step`` for decode works, all lanes in one batched step (a graph when captured): hidden
        rows, logits and their draws."""
        (hidden, logits), drawn, _ = self._launch_step(self._ready(*_decode_inputs(works)))
        return hidden, logits, drawn

    def launch(self, works: Sequence[Work]) -> Launched:
        """Launch a step of ``works`` (each lane fed its last drawn token; ``ahead_able``), its draws on
        the host's path where a lane asks for it, and the step after it (``go_on``)."""
        return self.go_on(self._launch(self._ready(*_decode_inputs(works))), works, further=True)

    def go_on(self, step: Launched, works: Sequence[Work], further: bool) -> Launched:
        """The step ``step`` ran ``works``' rows: its draws made on the host's path where its lanes
        ask for it (``drawn_on_host``) and, when ``further``, the step after it launched, made ready
        on the host first (its columns built while a grammar's masks fill). The step as it stands."""
        ready = self._following(step, works) if further else None
        if step.on_host:
            step = self.drawn_on_host(step, works)
        self.ahead = None if ready is None else self._launch(ready)
        return step

    def _ready(self, lanes: Sequence[Lane], starts: Sequence[int], tokens: Sequence[int]) -> _Ready:
        """The next step for ``lanes`` at rows ``starts`` fed ``tokens`` (token ids, or -(row + 1) for
        the token a step drew into that feed row, read on the device), made ready on the host: its
        columns, drawing into the feed half the next launch draws into."""
        parity = self.parity
        rows = self.memory.half(parity)[:len(lanes)]
        heads = [self.columns.head(token, start, lane.seed, lane.request.sampling.temperature, row)
                 for token, lane, start, row in zip(tokens, lanes, starts, rows, strict=True)]
        tails = [self._tail(lane) for lane in lanes]
        packed = self.columns.pack(heads, tails) if self.graphs is None else self.graphs.pack(heads, tails)
        return _Ready(tuple(lanes), tuple(starts), parity, packed)

    def _tail(self, lane: Lane) -> np.ndarray:
        """``lane``'s ``Columns.tail`` (its offsets and page table), made again only when its pages or
        offsets moved: every ``page_rows`` steps, not every step."""
        lease = lane.lease
        assert lease is not None
        key = (lease, len(lease.row_pages), lane.offsets)
        held = self.tails.get(lane)
        if held is None or held[0] != key:
            held = self.tails[lane] = (key, self.columns.tail(lane.offsets, lease.row_pages, self.null_page))
        return held[1]

    def _launch_step(self, ready: _Ready) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, DecodeBatch]:
        """``step`` for a step made ready (the next one: ``_ready`` since the last launch): its
        outputs, its draws (a view of the feed) and its inputs on the device (valid until the next
        step)."""
        assert ready.parity == self.parity, "a step launched past one made ready after it"
        self.parity ^= 1
        rows = self.memory.half(ready.parity)
        copied = self.copies[ready.parity]
        if copied is not None:  # the half's last copy to the host is done before this step draws over it
            torch.cuda.current_stream(self.device).wait_event(copied)
        if self.graphs is not None:
            outputs, batch = self.graphs.run(len(ready.lanes), ready.packed)
        else:
            batch = DecodeBatch(to_device(ready.packed, self.device), self.columns)
            outputs = self.step(batch)
        return outputs, self.memory.feed[rows.start:rows.start + len(ready.lanes)], batch

    def _launch(self, ready: _Ready) -> Launched:
        """Launch a step made ready and the copy of its draw to the host (on the side stream, after
        the step; a step drawn on the host's path copies in ``drawn_on_host``); nothing waits."""
        (_, logits), drawn, batch = self._launch_step(ready)
        first = self.memory.half(ready.parity).start
        if not all(lane.draws_alone for lane in ready.lanes):  # drawn_on_host draws and copies its tokens
            return Launched(ready.lanes, ready.starts, drawn, None, first, logits, True, batch)
        host, copied = self._copy_out(drawn, ready.parity)
        return Launched(ready.lanes, ready.starts, host, copied, first)

    def _copy_out(self, drawn: torch.Tensor, parity: int) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """``drawn`` (feed rows of half ``parity``) copied to the host on the side stream once the work
        queued so far is done, nothing waiting; the half's last copy noted (a plain copy elsewhere)."""
        if self.side is None:
            return drawn.clone(), None
        stepped = torch.cuda.Event()  # type: ignore[no-untyped-call]
        stepped.record(torch.cuda.current_stream(self.device))
        self.side.wait_event(stepped)
        with torch.cuda.stream(self.side):
            host, copied = to_host(drawn)
        self.copies[parity] = copied
        return host, copied

    def _following(self, step: Launched, works: Sequence[Work]) -> _Ready | None:
        """The step after ``step`` (the last one launched), made ready, for the lanes of ``works``
        (rows ``step`` ran) that will want one: not cancelled, short of their ``max_tokens``. Fed
        ``step``'s draw on the device; None when no lane will."""
        at = {id(lane): i for i, lane in enumerate(step.lanes)}
        going = [work for work in works if not work.lane.cancelled and work.lane.tokens_left > 1]
        if not going:
            return None
        lanes = [work.lane for work in going]
        starts = [work.start + 1 for work in going]
        for lane, start in zip(lanes, starts, strict=True):
            assert lane.lease is not None
            lane.lease.take(start + 1)
        return self._ready(lanes, starts, [-(step.first_row + at[id(lane)] + 1) for lane in lanes])


def _decode_inputs(works: Sequence[Work]) -> tuple[list[Lane], list[int], list[int]]:
    """Decode works' lanes, rows and tokens (each lane's last drawn token), for a launch."""
    lanes = [work.lane for work in works]
    return lanes, [work.start for work in works], [lane.generated[-1] for lane in lanes]

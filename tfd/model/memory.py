"""What a forward pass sees of the pool: lanes' piece views and page tables, and the row parts.

A ``Span`` is one lane's rows in a forward call: tokens at consecutive absolute positions from
``start``. Row parts (K, V, QSA index keys and pooled blocks) are read and written through the
lane's page table; state (GDN states, conv tails, PLE tail) through its piece views. Nothing here
copies a lane's memory except ``PageRows.read``, which gathers a lane's rows for the torch
reference path (the GPU kernels read pages in place).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import numpy as np
import torch

from tfd.pool.pages import Pool
from tfd.pool.staging import ring_for
from tfd.pool.views import PieceViews


@attrs.frozen
class LaneMemory:
    """One lane's memory: its state pieces (typed views) and the int32 page table of its rows; a pool
    lease's lane also its table's host copy (``Lease.host_table``, kept as the device's is written), which a
    prompt pass reads instead of the device's."""

    pieces: Mapping[str, torch.Tensor]
    page_table: torch.Tensor
    host_table: np.ndarray | None = attrs.field(default=None, eq=False)  # the device table's, as written

    def table_on_host(self) -> np.ndarray:
        """The page table's ids on the host: the host copy where the lane has one, else the device table
        read back (on CUDA a wait for the queued work: tests' own tables)."""
        return self.host_table if self.host_table is not None else self.page_table.cpu().numpy()


@attrs.frozen
class Span:
    """Rows ``start .. start + len(tokens) - 1`` of one lane.

    ``decode`` rows (one decoded token, or a verify window) use the recurrent arithmetic of the
    GDN layers; prefill rows the chunked one, chunks cut at multiples of 64 absolute positions so
    any prefill split at such multiples gives the same bits.
    """

    lane: LaneMemory
    start: int
    tokens: torch.Tensor
    decode: bool = False

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def end(self) -> int:
        return self.start + self.length


ALIGN = 16  # bytes each packed part starts on: a kernel reading it compiles once, whatever the counts before


def packed_on(parts: Mapping[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    """Host arrays on ``device`` in one copy (``to_device``), each part of the copy starting ``ALIGN`` bytes
    aligned (Triton compiles a kernel for a pointer that is so and again for one that is not: a step's row or
    lane count would pick between them while serving): each as a tensor of its dtype and shape."""
    at, places = 0, {}
    for name, part in parts.items():
        places[name] = at
        at += -(-part.nbytes // ALIGN) * ALIGN
    host = np.zeros(at, dtype=np.uint8)
    for name, part in parts.items():
        host[places[name]:places[name] + part.nbytes] = np.ascontiguousarray(part).reshape(-1).view(np.uint8)
    held = to_device(torch.from_numpy(host), device)
    return {name: held[places[name]:places[name] + part.nbytes].view(torch.from_numpy(part[:0]).dtype)
            .view(part.shape) for name, part in parts.items()}


def to_device(held: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``; on CUDA copied from pinned memory without waiting for the queued
    work: ``held`` itself where it is pinned (the caller keeps it until the copy has run), else through
    the device's pinned ring (``tfd.pool.staging``), so ``held`` may change as soon as this returns."""
    if device.type != "cuda":
        return held.to(device)
    if held.is_pinned():
        return held.to(device, non_blocking=True)
    dest = torch.empty(held.shape, dtype=held.dtype, device=device)
    ring_for(dest.device).put(held, dest)
    return dest


def to_host(held: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event]:
    """A CUDA tensor copied into pinned host memory on the current stream without waiting, and the
    event recorded after the copy (synchronize it before reading the copy)."""
    host = torch.empty(held.shape, dtype=held.dtype, pin_memory=True)
    host.copy_(held, non_blocking=True)
    copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
    copied.record(torch.cuda.current_stream(held.device))
    return host, copied


def ints_on(values: Sequence[int], device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Host integers (token ids, row indices, counts) as a tensor on ``device``, by ``to_device``; int64
    through numpy (``torch.tensor`` of a list of Python ints took ~4 times as long: a step's 8,192 prompt
    token ids ~430 us of host time)."""
    if dtype == torch.int64:
        return to_device(torch.from_numpy(np.fromiter(values, dtype=np.int64, count=len(values))), device)
    return to_device(torch.tensor(list(values), dtype=dtype), device)


def element_offset(buffer: torch.Tensor, view: torch.Tensor) -> int:
    """A piece view's element offset in ``buffer`` (the pool's bytes) seen as the view's dtype."""
    return (view.data_ptr() - buffer.data_ptr()) // view.element_size()


def piece_offsets(buffer: torch.Tensor, pieces: Mapping[str, torch.Tensor], names: Sequence[str]
                  ) -> list[int]:
    """``element_offset`` of each named piece of a lane's ``pieces``; for a pool lane's ``PieceViews`` on
    ``buffer``, from its pages alone (its views are made when first asked for: see ``tfd.pool.views``)."""
    return [int(at) for at in piece_offsets_array(buffer, pieces, tuple(names))]


def piece_offsets_array(buffer: torch.Tensor, pieces: Mapping[str, torch.Tensor], names: tuple[str, ...]
                        ) -> np.ndarray:
    """``piece_offsets`` as an int64 array: for a ``PieceViews`` on ``buffer`` in one numpy expression."""
    if isinstance(pieces, PieceViews) and pieces.buffer is buffer:
        return pieces.offsets(names)
    return np.array([element_offset(buffer, pieces[name]) for name in names], dtype=np.int64)


class PageRows:
    """The pool's row parts as ``[pages + 1, entries a page, *shape]`` views, by part name, and
    the pool's bytes (``buffer``), which kernels address lanes' state pieces in."""

    def __init__(self, pool: Pool) -> None:
        self.buffer = pool.buffer
        self.null_page = pool.null_page
        self.page_rows = pool.layout.page_rows
        self.views = {part.name: pool.rows(part.name) for part in pool.layout.row_parts}
        self.rows_an_entry = {part.name: part.rows for part in pool.layout.row_parts}

    def _places(self, part: str, lane: LaneMemory, entries: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        per_page = self.page_rows // self.rows_an_entry[part]
        pages = lane.page_table[torch.div(entries, per_page, rounding_mode="floor")].long()
        return pages, entries % per_page

    def write(self, part: str, lane: LaneMemory, entries: torch.Tensor, values: torch.Tensor) -> None:
        """Store ``values`` [n, *shape] at entry indices ``entries`` [n] (token positions, or block
        numbers for a pooled part)."""
        pages, slots = self._places(part, lane, entries)
        self.views[part][pages, slots] = values.to(self.views[part].dtype)

    def read(self, part: str, lane: LaneMemory, count: int) -> torch.Tensor:
        """The lane's first ``count`` entries of ``part``, as [count, *shape]."""
        entries = torch.arange(count, device=lane.page_table.device)
        pages, slots = self._places(part, lane, entries)
        return self.views[part][pages, slots]


@attrs.frozen
class PromptLanes:
    """The prompt spans of one forward as the prompt kernels address them, built once per forward.

    Lane b's rows are ``cu_seqlens[b] .. cu_seqlens[b + 1]`` of the call at positions from
    ``starts[b]``; ``page_table`` holds every lane's table (padded with the null page) for
    attention, ``positions`` and ``pages``/``slots`` each row's position and K/V place (entries of
    one row each), and ``offsets_of`` each GDN layer's state and conv-tail element offsets in the
    pool's bytes seen as fp32 (``states``) and as the model dtype (``tails``).
    """

    cu_seqlens: torch.Tensor  # int32 [lanes + 1]
    starts: torch.Tensor  # int32 [lanes]
    max_rows: int
    page_table: torch.Tensor  # int32 [lanes, pages]
    pages: torch.Tensor  # int64 [rows]
    slots: torch.Tensor  # int64 [rows]
    positions: torch.Tensor  # int64 [rows]
    states: torch.Tensor
    tails: torch.Tensor
    offsets: torch.Tensor  # int64 [2 * GDN layers, lanes (+ 1 if odd)]: a layer's state_at, then tail_at
    layers: Mapping[str, int]  # a GDN layer's place among them
    lanes: int

    def get(self) -> PromptLanes:
        """Itself (``LanesOnce.get``'s answer, made)."""
        return self

    def offsets_of(self, layer: str) -> tuple[torch.Tensor, torch.Tensor]:
        """GDN ``layer``'s (state_at, tail_at), int64 [lanes] each: views made when its layer runs, while
        the device runs the layers before (all at once, they were host time before the first launch)."""
        at = 2 * self.layers[layer]
        return self.offsets[at, :self.lanes], self.offsets[at + 1, :self.lanes]

    @classmethod
    def of(cls, spans: Sequence[Span], gdn_layers: Sequence[str], buffer: torch.Tensor, page_rows: int,
           null_page: int, dtype: torch.dtype) -> PromptLanes:
        """From the spans' lanes, their pieces in the pool's bytes ``buffer`` and their page tables
        (``page_rows`` rows a page; each lane's host copy, ``LaneMemory.table_on_host``): every field made
        on the host by numpy, then one host-to-device copy (pinned, not waited on) and no launch. The
        host's time here is the device's idle time before a prompt pass (the 35B-A3B's 8 x 1,024 step:
        ~1.3 ms on the H100's host, by torch ops on both)."""
        lanes = len(spans)
        lengths = np.fromiter((span.length for span in spans), dtype=np.int64, count=lanes)
        starts = np.fromiter((span.start for span in spans), dtype=np.int64, count=lanes)
        cu_seqlens = np.zeros(lanes + 1, dtype=np.int64)
        np.cumsum(lengths, out=cu_seqlens[1:])
        # each row's owning lane and position
        owners = np.repeat(np.arange(lanes), lengths)
        positions = np.arange(cu_seqlens[-1], dtype=np.int64) + np.repeat(starts - cu_seqlens[:-1], lengths)
        tables = [span.lane.table_on_host() for span in spans]
        table = np.full((lanes, max((len(t) for t in tables), default=0)), null_page, dtype=np.int32)
        for lane, ids in enumerate(tables):
            table[lane, :len(ids)] = ids
        names = tuple(f"{name}.{piece}" for name in gdn_layers for piece in ("state", "conv_tail"))
        # each piece's lanes in a row of even length: every row starts 16 bytes aligned
        offsets = np.zeros((len(names), lanes + lanes % 2), dtype=np.int64)
        for lane, span in enumerate(spans):
            offsets[:, lane] = piece_offsets_array(buffer, span.lane.pieces, names)
        pages = table[owners, positions // page_rows].astype(np.int64)
        held = packed_on({"cu_seqlens": cu_seqlens.astype(np.int32), "starts": starts.astype(np.int32),
                          "page_table": table, "pages": pages, "slots": positions % page_rows,
                          "positions": positions, "offsets": offsets}, buffer.device)
        return cls(held["cu_seqlens"], held["starts"], int(lengths.max(initial=0)), held["page_table"],
                   held["pages"], held["slots"], held["positions"], buffer.view(torch.float32),
                   buffer.view(dtype), held["offsets"], {name: i for i, name in enumerate(gdn_layers)}, lanes)


class LanesOnce:
    """``PromptLanes.of``'s arguments, the lanes made at the first ``get``: a forward's first layer asks
    for them once it has launched its projection, so the host makes them while the device runs it, not
    while the device waits (the pass's first launches need no lane field)."""

    def __init__(self, spans: Sequence[Span], gdn_layers: Sequence[str], buffer: torch.Tensor, page_rows: int,
                 null_page: int, dtype: torch.dtype) -> None:
        self._arguments = (spans, gdn_layers, buffer, page_rows, null_page, dtype)
        self._made: PromptLanes | None = None

    def get(self) -> PromptLanes:
        """The lanes, made on the first call."""
        if self._made is None:
            self._made = PromptLanes.of(*self._arguments)
        return self._made

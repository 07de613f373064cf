"""What a forward pass sees of the pool: lanes' piece views and page tables, and the row parts.

A ``Span`` is one lane's rows in a forward call: tokens at consecutive absolute positions from
``start``. Row parts (K, V, QSA index keys and pooled blocks) are read and written through the
lane's page table; state (GDN states, conv tails, PLE tail) through its piece views. Nothing here
copies a lane's memory except ``PageRows.read``, which gathers a lane's rows for the torch
reference path (the GPU kernels read pages in place).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import attrs
import numpy as np
import torch

from tfd.pool.pages import Pool
from tfd.pool.staging import ring_for
from tfd.pool.views import PieceViews


@attrs.frozen
class LaneMemory:
    """One lane's memory: its state pieces (typed views) and the int32 page table of its rows."""

    pieces: Mapping[str, torch.Tensor]
    page_table: torch.Tensor


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


def even_columns(held: torch.Tensor) -> torch.Tensor:
    """``held`` [fields, n] (8-byte elements) with a zero column more where n is odd: each field, a row
    of it, then starts 16 bytes after the last one, so on the device every field is 16-byte aligned
    whatever n is (Triton compiles a kernel for a pointer that is so and again for one that is not:
    the step's row or lane count would pick between them while serving)."""
    return torch.nn.functional.pad(held, (0, held.shape[1] % 2))


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
    if isinstance(pieces, PieceViews) and pieces.buffer is buffer:
        return [pieces.offset(name) for name in names]
    return [element_offset(buffer, pieces[name]) for name in names]


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
    one row each), and ``offsets`` each GDN layer's state and conv-tail element offsets in the
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
    offsets: Mapping[str, tuple[torch.Tensor, torch.Tensor]]  # GDN layer: (state_at, tail_at), int64 [lanes]

    @classmethod
    def of(cls, spans: Sequence[Span], gdn_layers: Sequence[str], buffer: torch.Tensor, page_rows: int,
           null_page: int, dtype: torch.dtype) -> PromptLanes:
        """From the spans' lanes, their pieces in the pool's bytes ``buffer`` and their page tables
        (``page_rows`` rows a page); one host-to-device copy (pinned, not waited on), one gather."""
        lanes = len(spans)
        lengths = [span.length for span in spans]
        # each row's position, page index, owning lane and slot, by torch on the host: a long prompt's
        # rows as Python ints took tens of milliseconds while the device waited
        positions = torch.cat([torch.arange(span.start, span.end, dtype=torch.int64) for span in spans])
        owners = torch.repeat_interleave(torch.arange(lanes, dtype=torch.int64), torch.tensor(lengths))
        per_row = torch.stack([positions // page_rows, owners, positions % page_rows, positions])
        # per lane: cu_seqlens and starts, then each GDN layer's state and tail offsets
        per_lane = [[0, *itertools.accumulate(lengths)], [span.start for span in spans] + [0]]
        names = [f"{name}.{piece}" for name in gdn_layers for piece in ("state", "conv_tail")]
        lanes_at = [piece_offsets(buffer, span.lane.pieces, names) for span in spans]
        per_lane += [[lane_at[i] for lane_at in lanes_at] + [0] for i in range(len(names))]
        count = len(positions)
        rows_held = even_columns(per_row)
        lanes_held = even_columns(torch.tensor(per_lane, dtype=torch.int64))
        packed = to_device(torch.cat([rows_held.flatten(), lanes_held.flatten()]), buffer.device)
        row_width, lane_width = rows_held.shape[1], lanes_held.shape[1]
        rowwise = packed[:4 * row_width].view(4, row_width)[:, :count]
        lanewise = packed[4 * row_width:].view(-1, lane_width)[:, :lanes + 1]
        width = max(span.lane.page_table.shape[0] for span in spans)
        page_table = torch.stack([
            torch.nn.functional.pad(span.lane.page_table, (0, width - len(span.lane.page_table)),
                                    value=null_page) for span in spans])
        offsets = {name: (lanewise[2 + 2 * i, :lanes], lanewise[3 + 2 * i, :lanes])
                   for i, name in enumerate(gdn_layers)}
        return cls(lanewise[0].to(torch.int32), lanewise[1, :lanes].to(torch.int32), max(lengths), page_table,
                   page_table[rowwise[1], rowwise[0]].long(), rowwise[2], rowwise[3],
                   buffer.view(torch.float32), buffer.view(dtype), offsets)

"""What a forward pass sees of the pool: lanes' piece views and page tables, and the row parts.

A ``Span`` is one lane's rows in a forward call: tokens at consecutive absolute positions from
``start``. Row parts (K, V, QSA index keys and pooled blocks) are read and written through the
lane's page table; state (GDN states, conv tails, PLE tail) through its piece views. Nothing here
copies a lane's memory except ``PageRows.read``, which gathers a lane's rows for the torch
reference path (the GPU kernels read pages in place).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import torch

from tfd.pool.pages import Pool


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


def element_offset(buffer: torch.Tensor, view: torch.Tensor) -> int:
    """A piece view's element offset in ``buffer`` (the pool's bytes) seen as the view's dtype."""
    return (view.data_ptr() - buffer.data_ptr()) // view.element_size()


class PageRows:
    """The pool's row parts as ``[pages + 1, entries a page, *shape]`` views, by part name, and
    the pool's bytes (``buffer``), which kernels address lanes' state pieces in."""

    def __init__(self, pool: Pool) -> None:
        self.buffer = pool.buffer
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

"""A decode step's inputs: every lane's fields in one int64 tensor, a column a lane (``Columns``,
``DecodeBatch``), so a captured graph reads them from a fixed address.

The fields, one row of ``DecodeBatch.packed`` each, contiguous across lanes: token (or the feed row a
step drew it into), position, visible keys, the sampling key and temperature bits, the feed row the
lane's own draw goes to, the offsets of its pieces in the pool (each GDN layer's state and conv tail,
the PLE tail and n-gram history), then its page table padded with the null page. A padding lane
(offsets -1, no keys, no draw) computes garbage that touches no memory of any lane.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import attrs
import numpy as np
import torch

from tfd.model.memory import to_device

FIXED = 6  # fields before the offsets: token, position, visible keys, seed, temperature, draw row


@attrs.frozen
class Columns:
    """Which rows of ``DecodeBatch.packed`` hold each field (a lane's fields are one column): the
    fixed fields, each GDN layer's state offset, each one's conv-tail offset, with ``ple`` the PLE
    tail and n-gram history offsets, then the page table."""

    gdn_layers: int
    pages: int  # page-table width: the most row pages a lane may hold
    ple: bool = False

    @property
    def offsets(self) -> int:
        """Offset fields a lane has."""
        return 2 * self.gdn_layers + (2 if self.ple else 0)

    @property
    def table_field(self) -> int:
        """The field (a row of ``DecodeBatch.packed``) where the page table starts."""
        return FIXED + self.offsets

    @property
    def width(self) -> int:
        return self.table_field + self.pages

    def column(self, token: int, position: int, seed: int, temperature: float, draw_row: int,
               offsets: Sequence[int], pages: Sequence[int], null_page: int) -> list[int]:
        """A live lane's fields: token (or -(row + 1): the token a decode step drew into that row of
        ``DecodeMemory.feed``), position, visible keys, its sampling key and temperature (fp32 bits),
        the feed row its own draw goes to, its offsets (``DecodeMemory.lane_offsets``), page table
        padded with the null page. Raises ValueError for offsets or pages that do not fit the
        columns."""
        self._check(offsets, pages)
        return [*self.head(token, position, seed, temperature, draw_row), *offsets, *pages,
                *[null_page] * (self.pages - len(pages))]

    def head(self, token: int, position: int, seed: int, temperature: float, draw_row: int) -> list[int]:
        """A live lane's fixed fields, as ``column`` begins (they change every step)."""
        return [token, position, position + 1, seed, temperature_bits(temperature), draw_row]

    def tail(self, offsets: Sequence[int], pages: Sequence[int], null_page: int) -> np.ndarray:
        """A live lane's fields after ``head``, as ``column`` ends them (they change when its pages do,
        a step in ``page_rows``: a decode step packs them from an array kept between steps)."""
        self._check(offsets, pages)
        tail = np.full(self.width - FIXED, null_page, dtype=np.int64)
        tail[:self.offsets] = offsets
        tail[self.offsets:self.offsets + len(pages)] = pages
        return tail

    def pack(self, heads: Sequence[Sequence[int]], tails: Sequence[np.ndarray], pinned: bool = False,
             padded_to: int = 0, padding: np.ndarray | None = None) -> torch.Tensor:
        """Host int64 [width, lanes] of each lane's ``head`` and ``tail`` (``fields_major`` of their
        ``column``s), then lanes of ``padding`` (``padding``'s fields as an int64 array, made once by
        the caller) up to ``padded_to`` lanes; in pinned memory with ``pinned``."""
        live = len(heads)
        packed = torch.empty((self.width, max(live, padded_to)), dtype=torch.int64, pin_memory=pinned)
        fields = packed.numpy()
        if live:
            fields[:FIXED, :live] = np.array(heads, dtype=np.int64).T
            np.stack(tails, axis=1, out=fields[FIXED:, :live])
        if padded_to > live:
            if padding is None:
                raise ValueError(f"{padded_to - live} padding lanes asked for without their fields")
            fields[:, live:] = padding[:, None]
        return packed

    def _check(self, offsets: Sequence[int], pages: Sequence[int]) -> None:
        if len(offsets) != self.offsets or len(pages) > self.pages:
            raise ValueError(f"a lane has {self.offsets} offsets and at most {self.pages} pages, got "
                             f"{len(offsets)} offsets and {len(pages)} pages")

    def padding(self, null_page: int) -> list[int]:
        """A padding lane's fields: no keys, greedy, no draw kept, offsets -1, every page the null
        page."""
        return [0, 0, 0, 0, 0, -1, *[-1] * self.offsets, *[null_page] * self.pages]


def temperature_bits(temperature: float) -> int:
    """A temperature as the int32 bits of its fp32 value: how a column holds it."""
    return int(struct.unpack("<i", struct.pack("<f", temperature))[0])


def fields_major(rows: Sequence[Sequence[int]]) -> torch.Tensor:
    """Host int64 [fields, rows] from a list a row (a column a lane, offsets a lane, ...): each field
    contiguous across rows, as the kernels read them. Through numpy, which reads a verify round's
    columns (each lane's whole page table) ~4x faster than ``torch.tensor``."""
    values = np.array(rows, dtype=np.int64).reshape(len(rows), -1) if rows else np.zeros((0, 0), np.int64)
    packed = torch.empty((values.shape[1], values.shape[0]), dtype=torch.int64)
    packed.numpy()[...] = values.T
    return packed


@attrs.frozen
class DecodeBatch:
    """``packed`` [columns.width, lanes] int64 on the device; the fields are views of it, each
    contiguous across lanes (``page_table`` is [lanes, pages] with a lane stride of one)."""

    packed: torch.Tensor
    columns: Columns

    @classmethod
    def of(cls, columns: list[list[int]], layout: Columns, device: torch.device) -> DecodeBatch:
        """From each lane's ``Columns.column`` (an asynchronous copy from pinned memory on CUDA)."""
        return cls(to_device(fields_major(columns), device), layout)

    @property
    def tokens(self) -> torch.Tensor:
        return self.packed[0]

    @property
    def positions(self) -> torch.Tensor:
        return self.packed[1]

    @property
    def lengths(self) -> torch.Tensor:
        return self.packed[2]

    @property
    def seeds(self) -> torch.Tensor:
        return self.packed[3]

    @property
    def temperature_bits(self) -> torch.Tensor:
        """int64 [lanes] holding each lane's fp32 temperature bits in the low half (the draw reads
        them so, with no launch to convert them)."""
        return self.packed[4]

    @property
    def draw_rows(self) -> torch.Tensor:
        """The ``DecodeMemory.feed`` row each lane's draw goes to (-1: none, a padding lane)."""
        return self.packed[5]

    def state_at(self, layer: int) -> torch.Tensor:
        return self.packed[FIXED + layer]

    def tail_at(self, layer: int) -> torch.Tensor:
        return self.packed[FIXED + self.columns.gdn_layers + layer]

    @property
    def ple_tail_at(self) -> torch.Tensor:
        """The PLE conv tail's offsets, in elements of the model dtype; ValueError without them."""
        return self.packed[self._ple_row()]

    @property
    def ple_history_at(self) -> torch.Tensor:
        """The n-gram history's offsets, in int64 elements; ValueError without them."""
        return self.packed[self._ple_row() + 1]

    def _ple_row(self) -> int:
        if not self.columns.ple:
            raise ValueError("the batch's columns hold no PLE offsets (Columns.ple is off) for a PLE layer")
        return FIXED + 2 * self.columns.gdn_layers

    @property
    def page_table(self) -> torch.Tensor:
        return self.packed[self.columns.table_field:].T


def lane_fields(batch: DecodeBatch) -> torch.Tensor:
    """Every row's offset fields, [columns.offsets, rows]: the GDN states', their conv tails', then
    (with PLE) the PLE tail's and the n-gram history's."""
    return batch.packed[FIXED:batch.columns.table_field]

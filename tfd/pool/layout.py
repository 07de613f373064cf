"""What one page holds and what one lane needs: the arithmetic of admission, in pages.

A page holds ``page_rows`` token rows of every row part (each attention layer's K and V, QSA raw
index keys and pooled blocks, the MTP head's rows), each part a 256-byte aligned region of the
page. A lane needs its state pages (its pieces, packed) plus the row pages of its window, and keeps
its ``outside`` buffers, if any, beyond the pool. Pure Python, so the scheduler can count pages
without torch.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Iterable

import attrs

from tfd.pool.pieces import ALIGN, DTYPE_BYTES, Piece, PieceMap, PieceOverPage, align_up, as_shape, pack


class Mode(enum.Enum):
    """How a lane holds its memory."""

    PIECES = "pieces"  # rows on any pages as they grow; state pieces on any whole pages
    STATE_RUN = "state_run"  # rows on any pages; state on one consecutive run of pages
    ONE_RUN = "one_run"  # pages off: state and every row of the window on one consecutive run


@attrs.frozen
class RowPart:
    """One cache on the pages: an entry of ``shape`` and ``dtype`` for every ``rows`` token rows.

    K and V take one entry per row; QSA's pooled index keys one per block of 4 rows.
    """

    name: str
    shape: tuple[int, ...] = attrs.field(converter=as_shape)
    dtype: str
    rows: int = 1

    @property
    def entry_bytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]

    def region_bytes(self, page_rows: int) -> int:
        """Bytes of this part's region in a page, aligned so the next region starts aligned."""
        return align_up(page_rows // self.rows * self.entry_bytes, ALIGN)


def _parts(parts: Iterable[RowPart]) -> tuple[RowPart, ...]:
    return tuple(parts)


def _pieces(pieces: Iterable[Piece]) -> tuple[Piece, ...]:
    return tuple(pieces)


@attrs.frozen
class Layout:
    """The page geometry and a lane's state, for one model at one page size.

    Raises ``ValueError`` when ``page_rows`` is not a whole number of every part's entries, and
    (from ``piece_map``) ``PieceOverPage`` naming the smallest page that would hold the piece.
    """

    page_rows: int
    row_parts: tuple[RowPart, ...] = attrs.field(converter=_parts)
    pieces: tuple[Piece, ...] = attrs.field(converter=_pieces)
    outside: tuple[Piece, ...] = attrs.field(converter=_pieces, default=())

    def __attrs_post_init__(self) -> None:
        if self.page_rows <= 0 or self.page_rows % self.granularity:
            raise ValueError(f"page_rows must be a positive multiple of {self.granularity}, "
                             f"got {self.page_rows}")
        names = [part.name for part in self.row_parts]
        if len(set(names)) != len(names):
            raise ValueError("row part names repeat")

    @functools.cached_property
    def granularity(self) -> int:
        """Page sizes must be a multiple of this many rows (pooled blocks are not split)."""
        return math.lcm(1, *(part.rows for part in self.row_parts))

    @functools.cached_property
    def part_offsets(self) -> dict[str, int]:
        """Where each row part's region starts inside a page."""
        offsets, at = {}, 0
        for part in self.row_parts:
            offsets[part.name] = at
            at += part.region_bytes(self.page_rows)
        return offsets

    @functools.cached_property
    def page_bytes(self) -> int:  # made once: lanes' openings ask for it, a sum over every row part
        return self.page_bytes_at(self.page_rows)

    def page_bytes_at(self, page_rows: int) -> int:
        # Empty row parts still leave a page of one alignment unit, so pieces have somewhere to go.
        return max(ALIGN, sum(part.region_bytes(page_rows) for part in self.row_parts))

    @property
    def row_bytes(self) -> float:
        """Bytes a token row costs in the pool, alignment of the regions included."""
        return self.page_bytes / self.page_rows

    @property
    def fixed_bytes(self) -> int:
        """A lane's bytes kept outside the pool (buffers it declares ``outside``)."""
        return sum(piece.nbytes for piece in self.outside)

    @functools.cached_property
    def piece_map(self) -> PieceMap:
        try:
            return pack(self.pieces, self.page_bytes)
        except PieceOverPage as error:
            raise PieceOverPage(error.piece, error.nbytes, self.page_bytes, self.page_rows,
                                self.smallest_page_rows()) from None

    @property
    def state_pages(self) -> int:
        return self.piece_map.pages

    def smallest_page_rows(self) -> int:
        """The fewest rows (a multiple of ``granularity``) whose page holds the largest piece."""
        largest = max((piece.nbytes for piece in self.pieces), default=0)
        step = self.granularity
        if not self.row_parts or largest <= self.page_bytes_at(step):
            return step
        low, high = 1, 1  # in steps: page_bytes_at(high * step) >= largest
        while self.page_bytes_at(high * step) < largest:
            low, high = high, high * 2
        while high - low > 1:
            middle = (low + high) // 2
            if self.page_bytes_at(middle * step) >= largest:
                high = middle
            else:
                low = middle
        return high * step

    def row_pages(self, window: int) -> int:
        """Pages that hold ``window`` token rows."""
        return -(-window // self.page_rows)

    def need(self, window: int) -> int:
        """Pages a lane of ``window`` tokens is promised at admission."""
        return self.state_pages + self.row_pages(window)

    def lane_bytes(self, window: int) -> int:
        """Memory a lane of ``window`` tokens costs: its pages and its bytes outside the pool."""
        return self.need(window) * self.page_bytes + self.fixed_bytes

    def plan(self, window: int, memory_limit: int) -> int:
        """How many lanes of ``window`` tokens fit ``memory_limit`` bytes (``--parallel auto``),
        beside the pool's one null page."""
        return max(0, memory_limit - self.page_bytes) // self.lane_bytes(window)

    def most_window(self, memory_limit: int) -> int:
        """The longest window of which one lane fits ``memory_limit`` bytes (0: none does)."""
        low, high = 0, 1
        while self.plan(high, memory_limit) >= 1:  # doubling, then halving the gap
            low, high = high, high * 2
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if self.plan(middle, memory_limit) >= 1 else (low, middle)
        return low

    def with_page_rows(self, page_rows: int) -> Layout:
        return Layout(page_rows, self.row_parts, self.pieces, self.outside)

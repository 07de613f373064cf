"""State pieces and the packer that places them on whole pages.

A lane's fixed-size state (GDN states, conv tails, PLE tail, MTP spares and logs) is a list of
pieces. ``pack`` places them first-fit decreasing: largest first (ties by name, so the same list
always gives the same map), each at the first page where it fits after the page's last piece,
aligned, never crossing a page boundary. ``check`` refuses a map with overlapping pieces or a
piece past its page. Pure Python: the scheduler may use it without torch.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

import attrs

ALIGN = 256
DTYPE_BYTES: Mapping[str, int] = {
    "float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1,
}


class PieceError(Exception):
    """A piece list or map that cannot be placed or is not sound."""


class PieceOverPage(PieceError):
    """A piece wider than a page: no placement can hold it.

    ``smallest_rows`` is the smallest page that holds it, in rows, when the layout knows rows.
    """

    def __init__(self, piece: str, nbytes: int, page_bytes: int, page_rows: int | None = None,
                 smallest_rows: int | None = None) -> None:
        self.piece = piece
        self.nbytes = nbytes
        self.page_bytes = page_bytes
        self.page_rows = page_rows
        self.smallest_rows = smallest_rows
        rows = f" ({page_rows} rows)" if page_rows is not None else ""
        floor = (f"; the smallest page that holds it has {smallest_rows} rows"
                 if smallest_rows is not None else "")
        super().__init__(f"PieceOverPage: piece {piece} needs {nbytes} bytes, more than a page of "
                         f"{page_bytes} bytes{rows}{floor}")


class PiecesOverlap(PieceError):
    """Two placed pieces share bytes."""


class PiecePastPage(PieceError):
    """A placed piece ends past its page, or sits on a page the map does not have."""


def as_shape(shape: Iterable[int]) -> tuple[int, ...]:
    return tuple(shape)


def _positive(instance: object, attribute: attrs.Attribute[tuple[int, ...]], shape: tuple[int, ...]) -> None:
    if not all(isinstance(n, int) and n > 0 for n in shape):
        raise ValueError(f"{attribute.name} must be positive integers, got {shape}")


def _known_dtype(instance: object, attribute: attrs.Attribute[str], dtype: str) -> None:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")


def _alignment(instance: object, attribute: attrs.Attribute[int], align: int) -> None:
    # Pages start at multiples of 256 bytes, so an alignment that divides 256 holds absolutely.
    if align <= 0 or ALIGN % align:
        raise ValueError(f"align must be a power of two up to {ALIGN}, got {align}")


@attrs.frozen
class Piece:
    """One buffer of a lane's state: a typed array that must lie inside one page."""

    name: str
    shape: tuple[int, ...] = attrs.field(converter=as_shape, validator=_positive)
    dtype: str = attrs.field(validator=_known_dtype)
    align: int = attrs.field(default=ALIGN, validator=_alignment)

    @property
    def nbytes(self) -> int:
        count = 1
        for n in self.shape:
            count *= n
        return count * DTYPE_BYTES[self.dtype]


@attrs.frozen
class Placement:
    """Where one piece lies: the lane's ``page``-th state page, at ``offset`` bytes."""

    name: str
    page: int
    offset: int
    nbytes: int
    align: int = ALIGN

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


@attrs.frozen
class PieceMap:
    """A packed piece list: ``pages`` state pages of ``page_bytes`` each."""

    page_bytes: int
    pages: int
    placements: tuple[Placement, ...]

    @property
    def piece_bytes(self) -> int:
        return sum(placement.nbytes for placement in self.placements)

    @property
    def padding_bytes(self) -> int:
        """Bytes of the state pages that hold no piece: alignment gaps and page tails."""
        return self.pages * self.page_bytes - self.piece_bytes

    def by_name(self) -> dict[str, Placement]:
        return {placement.name: placement for placement in self.placements}


def align_up(value: int, align: int) -> int:
    return -(-value // align) * align


def pack(pieces: Iterable[Piece], page_bytes: int) -> PieceMap:
    """Place ``pieces`` first-fit decreasing on pages of ``page_bytes``; deterministic.

    Raises ``PieceOverPage`` naming the first piece wider than a page, and ``PieceError`` for two
    pieces of one name.
    """
    pieces = list(pieces)
    names = [piece.name for piece in pieces]
    if len(set(names)) != len(names):
        raise PieceError(f"piece names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    fills: list[int] = []  # each page's first free byte after its last piece
    placements = []
    for piece in sorted(pieces, key=lambda piece: (-piece.nbytes, piece.name)):
        if piece.nbytes > page_bytes:
            raise PieceOverPage(piece.name, piece.nbytes, page_bytes)
        for page, fill in enumerate(fills):  # noqa: B007 (page is used after the break)
            offset = align_up(fill, piece.align)
            if offset + piece.nbytes <= page_bytes:
                break
        else:
            page, offset = len(fills), 0
            fills.append(0)
        fills[page] = offset + piece.nbytes
        placements.append(Placement(piece.name, page, offset, piece.nbytes, piece.align))
    return PieceMap(page_bytes, len(fills), tuple(placements))


def check(piece_map: PieceMap) -> None:
    """Refuse a map where a piece is misaligned, past its page, or overlapping another."""
    pages: dict[int, list[Placement]] = {}
    for placement in piece_map.placements:
        if not 0 <= placement.page < piece_map.pages or placement.offset < 0 \
                or placement.end > piece_map.page_bytes:
            raise PiecePastPage(f"piece {placement.name} at page {placement.page} bytes "
                                f"{placement.offset}..{placement.end} lies outside the map's "
                                f"{piece_map.pages} pages of {piece_map.page_bytes} bytes")
        if placement.offset % placement.align:
            raise PiecePastPage(f"piece {placement.name} at offset {placement.offset} is not "
                                f"{placement.align}-byte aligned")
        pages.setdefault(placement.page, []).append(placement)
    for page, placed in pages.items():
        placed.sort(key=lambda placement: placement.offset)
        for before, after in itertools.pairwise(placed):
            if before.end > after.offset:
                raise PiecesOverlap(f"pieces {before.name} and {after.name} overlap on page {page} "
                                    f"({before.offset}..{before.end} and {after.offset}..{after.end})")

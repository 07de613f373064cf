"""Typed views of a lane's pieces on pool pages, and the fills that make pages fresh.

Both run on the engine thread when a lane opens, between steps, so their cost on the host is what
matters: one ``as_strided`` a piece from a typed view of the pool's bytes made once (not a slice
and two casts), and one fill a run of consecutive pages (not one a piece). On the H100 the 35B-A3B
opened each lane of an 8 x 1,024 prefill in ~2 ms of host time with a view and a fill a piece (48
pieces), while the device waited (docs/bench.md, 2026-12-06).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch

from tfd.pool.pieces import Piece, Placement

TORCH_DTYPES: Mapping[str, torch.dtype] = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
    "float8_e4m3fn": torch.float8_e4m3fn, "int64": torch.int64, "int32": torch.int32,
    "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
}


class TypedBytes:
    """A byte buffer's views as each dtype, each made once (the buffer's length a multiple of 8)."""

    def __init__(self, buffer: torch.Tensor) -> None:
        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or not buffer.is_contiguous():
            raise ValueError(f"buffer is {buffer.dtype} {list(buffer.shape)}, expected contiguous uint8 "
                             "bytes")
        self.buffer = buffer
        self._views: dict[torch.dtype, torch.Tensor] = {}

    def of(self, dtype: torch.dtype) -> torch.Tensor:
        view = self._views.get(dtype)
        if view is None:
            view = self._views[dtype] = self.buffer.view(dtype)
        return view

    def piece(self, piece: Piece, start: int) -> torch.Tensor:
        """``piece`` as a tensor of its shape and dtype at byte ``start`` of the buffer (a multiple of
        the dtype's size: pieces are aligned to at least that)."""
        typed = self.of(TORCH_DTYPES[piece.dtype])
        size = typed.element_size()
        if start % size or start < 0 or start + piece.nbytes > self.buffer.numel():
            raise ValueError(f"piece {piece.name!r} at byte {start} ({piece.nbytes} bytes) does not fit "
                             f"{self.buffer.numel()} bytes at its {size}-byte alignment")
        return typed.as_strided(piece.shape, _contiguous(piece.shape), typed.storage_offset() + start // size)


@functools.cache
def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def place(typed: TypedBytes, page_bytes: int, placements: Mapping[str, Placement], pieces: Iterable[Piece],
          pages: Sequence[int]) -> dict[str, torch.Tensor]:
    """Typed views of ``pieces`` at their ``placements`` (a piece map's, by name) on the pool pages
    ``pages`` (pages of ``page_bytes`` in ``typed``'s buffer)."""
    views = {}
    for piece in pieces:
        placement = placements[piece.name]
        views[piece.name] = typed.piece(piece, pages[placement.page] * page_bytes + placement.offset)
    return views


class Stamp:
    """``pieces`` at their ``placements`` on pages of ``page_bytes`` in ``typed``'s buffer, checked once
    (each piece's place a multiple of its dtype's size on any page; the pages and bytes they reach), for
    ``views``."""

    def __init__(self, typed: TypedBytes, page_bytes: int, placements: Mapping[str, Placement],
                 pieces: Sequence[Piece]) -> None:
        self.typed = typed
        self.page_bytes = page_bytes
        self.placements = placements
        self.pieces = pieces
        self.made = {piece.name: (piece, placements[piece.name]) for piece in pieces}  # in ``place``'s order
        sizes = [TORCH_DTYPES[piece.dtype].itemsize for piece in pieces]
        self.whole = all(not page_bytes % size and not placement.offset % size
                         for (_, placement), size in zip(self.made.values(), sizes, strict=True))
        self.reach = max((placement.offset + piece.nbytes for piece, placement in self.made.values()),
                         default=0)
        self.pages = max((placement.page + 1 for _, placement in self.made.values()), default=0)
        self._addresses: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def addresses(self, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Pieces ``names``' pages (indices into a lane's pages), byte offsets on them and dtype sizes, as
        int64 arrays, made once for each tuple of names (KeyError naming a piece there is none of)."""
        found = self._addresses.get(names)
        if found is None:
            made = [self.made[name] for name in names]
            found = self._addresses[names] = (
                np.array([placement.page for _, placement in made], dtype=np.int64),
                np.array([placement.offset for _, placement in made], dtype=np.int64),
                np.array([TORCH_DTYPES[piece.dtype].itemsize for piece, _ in made], dtype=np.int64))
        return found

    def views(self, pages: Sequence[int]) -> Mapping[str, torch.Tensor]:
        """``place(typed, page_bytes, placements, pieces, pages)``: the same views, each made when first
        asked for (``PieceViews``); pages it cannot vouch for at once (too few, past the buffer, a piece
        off its dtype's alignment) go to ``place``, which raises as before."""
        if not self.whole or len(pages) < self.pages or (pages and min(pages) < 0) \
                or (pages and max(pages) * self.page_bytes + self.reach > self.typed.buffer.numel()):
            return place(self.typed, self.page_bytes, self.placements, self.pieces, pages)
        return PieceViews(self, tuple(pages))


class PieceViews(Mapping[str, torch.Tensor]):
    """A lane's piece views on its state ``pages`` by ``stamp`` (``place``'s, in its order), each made when
    first asked for: a lane of the 35B-A3B has 48 pieces, and an ``as_strided`` a piece at its opening
    was most of the host time the lane's admission took, while a step of prompts on CUDA and a decode
    step read pieces only as offsets (``offset``, no view made). Views made on any thread are the same."""

    def __init__(self, stamp: Stamp, pages: tuple[int, ...]) -> None:
        self.stamp = stamp
        self.pages = pages
        self._views: dict[str, torch.Tensor] = {}

    @property
    def buffer(self) -> torch.Tensor:
        """The byte buffer the pieces lie in."""
        return self.stamp.typed.buffer

    def __getitem__(self, name: str) -> torch.Tensor:
        view = self._views.get(name)
        if view is None:
            piece, _ = self.stamp.made[name]
            view = self._views[name] = self.stamp.typed.piece(piece, self._start(name))
        return view

    def __contains__(self, name: object) -> bool:
        return name in self.stamp.made

    def __iter__(self) -> Iterator[str]:
        return iter(self.stamp.made)

    def __len__(self) -> int:
        return len(self.stamp.made)

    def offset(self, name: str) -> int:
        """Piece ``name``'s element offset in the buffer seen as its dtype (its view's ``element_offset``)."""
        piece, _ = self.stamp.made[name]
        return self._start(name) // TORCH_DTYPES[piece.dtype].itemsize

    def offsets(self, names: tuple[str, ...]) -> np.ndarray:
        """``offset`` of each of ``names``, int64, in one numpy expression (a prompt pass asks for 60 a lane
        of the 35B-A3B, while the device waits)."""
        page, at, size = self.stamp.addresses(names)
        return (np.asarray(self.pages, dtype=np.int64)[page] * self.stamp.page_bytes + at) // size

    def _start(self, name: str) -> int:
        """Piece ``name``'s first byte in the buffer."""
        _, placement = self.stamp.made[name]
        return self.pages[placement.page] * self.stamp.page_bytes + placement.offset


def page_runs(pages: Iterable[int]) -> list[tuple[int, int]]:
    """The distinct ``pages`` as runs of consecutive ids, ``(first, stop)`` each, ascending."""
    runs: list[tuple[int, int]] = []
    for page in sorted(set(pages)):
        if runs and runs[-1][1] == page:
            runs[-1] = (runs[-1][0], page + 1)
        else:
            runs.append((page, page + 1))
    return runs


def zero_pages(buffer: torch.Tensor, page_bytes: int, pages: Iterable[int]) -> int:
    """Every byte of ``pages`` (of ``page_bytes`` each in the byte ``buffer``) zeroed, one fill a run
    of consecutive pages; returns the fills made."""
    runs = page_runs(pages)
    for first, stop in runs:
        buffer[first * page_bytes:stop * page_bytes].zero_()
    return len(runs)

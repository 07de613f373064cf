"""Piece views and page fills (tfd.pool.views): what a lane's opening costs the host, and that it
still gives the bytes it gave before: views at the map's places, every state byte zero, then the
lane's nonzero initial state."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch

from tfd.model.memory import element_offset, piece_offsets
from tfd.pool import pages as pool_pages
from tfd.pool.layout import Layout, RowPart
from tfd.pool.pages import Pool
from tfd.pool.pieces import Piece
from tfd.pool.views import PieceViews, TypedBytes, page_runs, place, zero_pages

ROWS = 16  # a page is 1 KiB (one row of "k" is 64 bytes)


def layout() -> Layout:
    """a (600 B) and c (200 B) share state page 0, b (600 B) is alone on page 1."""
    pieces = [Piece("a", (150,), "float32"), Piece("b", (300,), "bfloat16"), Piece("c", (25,), "int64")]
    return Layout(ROWS, [RowPart("k", (32,), "bfloat16")], pieces)


@pytest.mark.parametrize(("pages", "runs"), [
    ([], []), ([3], [(3, 4)]), ([0, 1, 2], [(0, 3)]), ([0, 2], [(0, 1), (2, 3)]),
    ([5, 4, 4, 7], [(4, 6), (7, 8)]),  # unsorted, repeated
])
def test_pages_make_runs_of_consecutive_ids(pages: list[int], runs: list[tuple[int, int]]) -> None:
    assert page_runs(pages) == runs


@pytest.mark.parametrize(("pages", "fills"), [([1, 2, 3], 1), ([1, 3], 2)])
def test_zeroing_pages_touches_those_pages_alone_a_fill_a_run(pages: list[int], fills: int) -> None:
    buffer = torch.full((5 * 8,), 0xAB, dtype=torch.uint8)
    assert zero_pages(buffer, 8, pages) == fills
    for page in range(5):
        expected = 0 if page in pages else 0xAB
        assert buffer[page * 8:(page + 1) * 8].eq(expected).all(), page


def test_a_piece_view_lies_on_its_bytes_and_a_bad_place_is_refused() -> None:
    buffer = torch.zeros(64, dtype=torch.uint8)
    typed = TypedBytes(buffer)
    view = typed.piece(Piece("x", (2, 3), "int16", align=2), 10)
    assert view.shape == (2, 3) and view.dtype == torch.int16 and view.is_contiguous()
    view.copy_(torch.arange(1, 7, dtype=torch.int16).view(2, 3))
    assert buffer[10:22].view(torch.int16).tolist() == [1, 2, 3, 4, 5, 6]
    assert not buffer[:10].any() and not buffer[22:].any()
    with pytest.raises(ValueError, match="piece 'y' at byte 6"):
        typed.piece(Piece("y", (2,), "float32", align=4), 6)  # not on a 4-byte boundary
    with pytest.raises(ValueError, match="piece 'z' at byte 56"):
        typed.piece(Piece("z", (3,), "float32", align=4), 56)  # past the end
    with pytest.raises(ValueError, match="expected contiguous uint8"):
        TypedBytes(torch.zeros(8, dtype=torch.float32))


def counted_fills(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The fills each opening made from now on."""
    made: list[int] = []

    def spy(buffer: torch.Tensor, page_bytes: int, pages: list[int]) -> int:
        made.append(zero_pages(buffer, page_bytes, pages))
        return made[-1]
    monkeypatch.setattr(pool_pages, "zero_pages", spy)
    return made


@pytest.mark.parametrize("fragmented", [False, True])
def test_a_lane_opens_zeroed_then_initialised_in_a_fill_a_run_of_pages(
        fragmented: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    pool = Pool(layout(), 8)
    held = None
    if fragmented:  # page 1 held past its lane's end: lowest first, the next lane takes 0 and 2
        first = pool.promise(ROWS)
        first.take_state()
        first.take(ROWS)
        held = pool.hold([1])
        first.finish()
    pool.buffer.fill_(0x5C)  # every page dirty, as another lane would leave it
    fills = counted_fills(monkeypatch)
    seen: dict[str, bool] = {}

    def init(pieces: Mapping[str, torch.Tensor]) -> None:
        seen.update({name: not view.any() for name, view in pieces.items()})
        pieces["c"].fill_(7)
    lease = pool.promise(ROWS)
    pieces = lease.take_state(init)
    assert lease.state_pages == ([0, 2] if fragmented else [0, 1])
    assert fills == [2 if fragmented else 1]
    assert seen == {"a": True, "b": True, "c": True}
    assert pieces["c"].eq(7).all() and not pieces["a"].any() and not pieces["b"].any()
    for page in lease.state_pages:  # the bytes between and after pieces too
        assert pool.page_bytes_view(page).ne(0x5C).all()
    lease.finish()
    if held is not None:
        held.release()


def test_views_are_the_bytes_the_map_places_them_at() -> None:
    pool = Pool(layout(), 6)
    lease = pool.promise(ROWS)
    pieces = lease.take_state()
    placements = pool.layout.piece_map.by_name()
    base = pool.buffer.data_ptr()
    for name, view in pieces.items():
        placement = placements[name]
        page = lease.state_pages[placement.page]
        assert view.data_ptr() - base == page * pool.layout.page_bytes + placement.offset, name
        assert view.nbytes == placement.nbytes
    assert pool.placements(pool.layout.piece_map) is pool.placements(pool.layout.piece_map)  # made once
    lease.finish()
    pool.check_at_load()


@pytest.mark.parametrize("fragmented", [False, True])
def test_a_lanes_views_made_when_asked_are_the_views_and_offsets_place_gives(fragmented: bool) -> None:
    pool = Pool(layout(), 8)
    held = None
    if fragmented:  # page 1 held: the lane's state pages are 0 and 2
        first = pool.promise(ROWS)
        first.take_state()
        first.take(ROWS)
        held = pool.hold([1])
        first.finish()
    lease = pool.promise(ROWS)
    pieces = lease.take_state()
    assert isinstance(pieces, PieceViews)
    assert lease.state_pages == ([0, 2] if fragmented else [0, 1])
    layout_ = pool.layout
    eager = place(pool.typed, layout_.page_bytes, pool.placements(layout_.piece_map), layout_.pieces,
                  lease.state_pages)
    assert list(pieces) == list(eager) and len(pieces) == len(eager) and "c" in pieces and "d" not in pieces
    names = list(eager)
    assert piece_offsets(pool.buffer, pieces, names) == [element_offset(pool.buffer, eager[n]) for n in names]
    for name, view in eager.items():
        lazy = pieces[name]
        assert lazy is pieces[name]  # made once
        assert (lazy.data_ptr(), lazy.shape, lazy.stride(), lazy.dtype) == \
            (view.data_ptr(), view.shape, view.stride(), view.dtype), name
    with pytest.raises(KeyError):
        pieces["d"]
    lease.finish()
    if held is not None:
        held.release()
    pool.check_at_load()

"""Page geometry and a lane's need, with the real Flash Next shapes checked by hand."""

from __future__ import annotations

import pytest

from tfd.families.lane_state import AttentionRows, DraftBuffers, GdnLayers, PleState, lane_pieces
from tfd.pool.layout import Layout, Mode, RowPart
from tfd.pool.pages import Pool
from tfd.pool.pieces import Piece, PieceOverPage
from tfd.pool.report import LoadReport

MIB = 1 << 20
# Qwen3.8-Flash-Next (reference/model.md section 3): 48 layers, every 4th a QSA layer.
QSA_LAYERS = [f"layer{n}" for n in range(3, 48, 4)]
GDN = GdnLayers([f"layer{n}" for n in range(48) if n % 4 != 3], key_heads=16, value_heads=48,
                key_dim=128, value_dim=128, conv_kernel=4)
PLE = PleState(width=4 * 2560, taps=3 * 3, history=2)
DRAFTS = 3


def flash_next(page_rows: int = 256, *, head: bool = True) -> Layout:
    rows = AttentionRows([*QSA_LAYERS, "mtp"] if head else QSA_LAYERS, kv_heads=2, head_dim=256,
                         index_dim=128)
    drafts = DraftBuffers(DRAFTS + 1, GDN, hidden=4 * 2560, ple=PLE) if head else None
    return Layout(page_rows, rows.parts(), lane_pieces(GDN, PLE, drafts))


def test_flash_next_page_and_row_bytes_by_hand() -> None:
    # A QSA layer, per token: K and V of 2 heads x 256 bf16 (1024 B each), a raw index key of
    # 128 bf16 (256 B), and a pooled key of 128 bf16 per 4 tokens (64 B): 2368 B.
    per_layer_page = 256 * (1024 + 1024 + 256) + 256 // 4 * 256
    assert per_layer_page == 606_208
    assert flash_next().page_bytes == 13 * per_layer_page == 7_880_704  # 12 QSA + the MTP layer
    assert flash_next(head=False).page_bytes == 12 * per_layer_page
    assert flash_next().row_bytes == 13 * 2368


def test_flash_next_lane_pieces_pages_and_padding_by_hand() -> None:
    layout = flash_next()
    window = DRAFTS + 1
    state = 48 * 128 * 128 * 4  # 3 MiB
    log = window * (16 * 128 + 48 * 128 + 2 * 48) * 4
    conv_tail, conv_rows = 3 * 10240 * 2, window * 10240 * 2
    ple_tail, ple_rows = 9 * 10240 * 2, window * 10240 * 2
    small = {"ple.history": 2 * 8, "ple.tokens": window * 8, "mtp.hidden": 10240 * 4,
             "mtp.drafts": DRAFTS * 8}
    # Own state: 36 states, 36 conv tails, PLE tail and history; drafting: 36 spares, logs,
    # conv rows, then PLE rows and tokens, the MTP hidden stack and its drafts.
    assert len(layout.pieces) == 36 * 2 + 2 + 36 * 3 + 2 + 2 == 186
    piece_bytes = 72 * state + 36 * (log + conv_tail + conv_rows) + ple_tail + ple_rows + sum(small.values())
    assert layout.piece_map.piece_bytes == piece_bytes

    # Two 3 MiB states fill a page to 6 MiB (three would not fit): the 72 take 36 pages, and
    # each page keeps 1,552 KiB free. Every other piece is at most 180 KiB, so a 37th page would
    # open only once all 36 had under 180 KiB free, i.e. after more than 36 x 1,372 KiB of small
    # pieces; there are under 10 MiB of them. So: 36 pages.
    page = layout.page_bytes
    assert 2 * state <= page < 3 * state
    left = page - 2 * state
    rest = piece_bytes - 72 * state + 4 * 256  # the four small pieces round up to 256 each
    assert max(log, conv_tail, conv_rows, ple_tail, ple_rows) == ple_tail < left
    assert rest < 36 * (left - ple_tail)
    assert layout.state_pages == 36
    assert layout.piece_map.padding_bytes == 36 * page - piece_bytes == 46_970_808

    report = LoadReport.of(Pool(layout, 64), window=4096)
    assert (report.pieces_a_lane, report.state_pages_a_lane, report.row_pages_a_lane) == (186, 36, 16)
    assert report.pages_a_lane == 52
    assert report.padding_bytes == 46_970_808
    assert report.padding_percent == round(100 * 46_970_808 / (36 * page), 2) == 16.56
    assert report.lanes_that_fit == 1
    assert "186 pieces (225.77 MiB) on 36 pages, padding 44.79 MiB (16.56 %)" in report.line()


def test_flash_next_without_the_head_by_hand() -> None:
    layout = flash_next(head=False)
    assert len(layout.pieces) == 74
    # 36 states two a page on 18 pages; conv tails (60 KiB) and the PLE tail fill the gaps.
    assert layout.state_pages == 18
    state = 48 * 128 * 128 * 4
    piece_bytes = 36 * state + 36 * 3 * 10240 * 2 + 9 * 10240 * 2 + 16
    assert layout.piece_map.padding_bytes == 18 * layout.page_bytes - piece_bytes


def test_the_smallest_flash_next_page_holds_a_state() -> None:
    state = 48 * 128 * 128 * 4
    for head, rows in ((True, 104), (False, 112)):
        assert flash_next(head=head).smallest_page_rows() == rows
        assert flash_next(rows, head=head).page_bytes >= state
        assert flash_next(rows - 4, head=head).page_bytes < state  # a page is whole pooled blocks
        with pytest.raises(PieceOverPage, match=f"the smallest page that holds it has {rows} rows"):
            flash_next(rows - 4, head=head).piece_map  # noqa: B018


def test_need_and_plan() -> None:
    layout = Layout(16, [RowPart("k", (64,), "uint8")], [Piece("s", (1000,), "uint8")],
                    outside=[Piece("wide", (5000,), "uint8")])
    assert layout.page_bytes == 1024
    assert layout.state_pages == 1
    assert layout.row_pages(1) == 1
    assert layout.row_pages(16) == 1
    assert layout.row_pages(17) == 2
    assert layout.need(100) == 1 + 7
    assert layout.lane_bytes(100) == 8 * 1024 + 5000
    # The pool's null page comes out of the limit first.
    assert layout.plan(100, 10 * 13192 + 1024) == 10
    assert layout.plan(100, 10 * 13192 + 1023) == 9
    assert layout.plan(100, 500) == 0


def test_the_longest_window_one_lane_of_which_fits() -> None:
    layout = Layout(16, [RowPart("k", (64,), "uint8")], [Piece("s", (1000,), "uint8")],
                    outside=[Piece("wide", (5000,), "uint8")])
    # null page, state page, 5000 bytes outside, then 16 rows a page
    for pages in (1, 7, 100):
        limit = 1024 + 1024 + 5000 + pages * 1024
        assert layout.most_window(limit) == pages * 16
        assert layout.plan(pages * 16, limit) == 1 and layout.plan(pages * 16 + 1, limit) == 0
        assert layout.most_window(limit - 1) == (pages - 1) * 16
    assert layout.most_window(1024 + 1024 + 5000) == 0  # no row page fits beside the state
    assert layout.most_window(0) == 0


def test_page_rows_must_hold_whole_blocks() -> None:
    parts = AttentionRows(["a"], kv_heads=1, head_dim=8, index_dim=8).parts()
    with pytest.raises(ValueError, match="multiple of 4"):
        Layout(30, parts, [])
    assert Layout(32, parts, []).granularity == 4
    assert Mode("pieces") is Mode.PIECES

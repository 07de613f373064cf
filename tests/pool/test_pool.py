"""Pool and leases: promise, take, state pieces, finish, and the census after every path."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tfd.pool.device_plan import GIB, DevicePlan
from tfd.pool.errors import Leak, LeaseFinished, NoRun, OverPromise, PoolError, PoolShort
from tfd.pool.layout import Layout, Mode, RowPart
from tfd.pool.pages import Pool
from tfd.pool.pieces import Piece
from tfd.pool.report import LoadReport

ROWS = 16  # rows per page; one row of part "k" is 64 bytes, so a page is 1 KiB


def layout(*, outside: tuple[Piece, ...] = ()) -> Layout:
    """Three typed pieces that pack on two pages: a (600 B) and c (200 B) share page 0."""
    pieces = [Piece("a", (150,), "float32"), Piece("b", (300,), "bfloat16"), Piece("c", (25,), "int64")]
    return Layout(ROWS, [RowPart("k", (32,), "bfloat16")], pieces, outside)


def test_the_small_layout() -> None:
    small = layout()
    assert small.page_bytes == 1024
    assert small.state_pages == 2
    assert small.piece_map.by_name()["c"].page == small.piece_map.by_name()["a"].page


def test_a_lane_from_promise_to_finish() -> None:
    pool = Pool(layout(), 10)
    lease = pool.promise(3 * ROWS)
    assert lease.holds.may_take == 2 + 3
    assert pool.available == 5
    pieces = lease.take_state()
    assert lease.state_pages == [0, 1]
    lease.take(1)
    lease.take(ROWS)  # still the first page
    assert lease.row_pages == [2]
    lease.take(ROWS + 1)
    assert lease.row_pages == [2, 3]
    assert lease.holds.row_pages == 2 and lease.holds.state_pages == 2 and lease.holds.may_take == 1
    assert pool.census().as_dict()["lanes"] == {0: {"row_pages": 2, "state_pages": 2, "promised": 1}}
    assert pieces["a"].dtype == torch.float32 and pieces["a"].shape == (150,)
    lease.finish()
    lease.finish()  # again: nothing more
    pool.check_at_load()
    with pytest.raises(LeaseFinished):
        lease.take(1)
    with pytest.raises(LeaseFinished):
        lease.pieces  # noqa: B018


def test_pages_go_out_lowest_first() -> None:
    pool = Pool(layout(), 12)
    first, second, third = (pool.promise(ROWS) for _ in range(3))
    for lease in (first, second, third):
        lease.take_state()
        lease.take(ROWS)
    assert (first.state_pages, second.state_pages, third.state_pages) == ([0, 1], [3, 4], [6, 7])
    assert (first.row_pages, second.row_pages, third.row_pages) == ([2], [5], [8])
    second.finish()
    fourth = pool.promise(2 * ROWS)
    fourth.take(2 * ROWS)
    assert fourth.row_pages == [3, 4]
    fourth.take_state()
    assert fourth.state_pages == [5, 9]
    for lease in (first, third, fourth):
        lease.finish()
    pool.check_at_load()


def test_page_table_points_unmapped_rows_at_the_null_page() -> None:
    pool = Pool(layout(), 8)
    lease = pool.promise(4 * ROWS)
    lease.take_state()
    lease.take(2 * ROWS)
    table = lease.page_table
    assert table.dtype == torch.int32
    assert table.tolist() == [2, 3, pool.null_page, pool.null_page]
    assert lease.host_table.tolist() == table.tolist()  # the host's copy, as a prompt pass reads it
    lease.take(3 * ROWS)  # one page more: the copy follows
    assert lease.host_table.tolist() == table.tolist() == [2, 3, 4, pool.null_page]
    rows = pool.rows("k")  # [pages + 1, rows a page, 32] bfloat16, a view of the buffer
    assert rows.shape == (9, ROWS, 32)
    assert rows.untyped_storage().data_ptr() == pool.buffer.untyped_storage().data_ptr()
    # Write row 20 of the lane (page 1 of its table, row 4) and find it in the buffer.
    rows[table[20 // ROWS], 20 % ROWS] = 7.0
    start = 3 * 1024 + 4 * 64
    assert pool.buffer[start:start + 64].view(torch.bfloat16).eq(7.0).all()
    lease.finish()
    assert pool.census().null_clean
    pool.rows("k")[pool.null_page, 0, 0] = 1.0  # a stray write to the null page is seen
    with pytest.raises(Leak, match="LEAK"):
        pool.check_at_load()


def test_piece_views_are_views_and_lanes_never_alias() -> None:
    pool = Pool(layout(), 9)
    lanes = [pool.promise(ROWS) for _ in range(3)]
    views = [lease.take_state() for lease in lanes]
    base = pool.buffer.untyped_storage().data_ptr()
    for pieces in views:
        for view in pieces.values():
            assert view.untyped_storage().data_ptr() == base  # no copy
    for index, pieces in enumerate(views):
        for name, view in pieces.items():
            view.fill_(index * 10 + ord(name[0]) % 7 + 1)
    for index, pieces in enumerate(views):
        for name, view in pieces.items():
            assert view.eq(index * 10 + ord(name[0]) % 7 + 1).all(), (index, name)
    spans = sorted((view.data_ptr() - base, view.data_ptr() - base + view.nbytes)
                   for pieces in views for view in pieces.values())
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
    for lease in lanes:
        lease.finish()
    pool.check_at_load()


def test_a_fresh_state_is_zero_even_on_pages_another_lane_wrote() -> None:
    pool = Pool(layout(), 4)
    lease = pool.promise(ROWS)
    for view in lease.take_state().values():
        view.fill_(3)
    lease.finish()
    again = pool.promise(ROWS)
    assert all(not view.any() for view in again.take_state().values())
    again.finish()


def fragmented(pool: Pool) -> list[object]:
    """Every other page held: a lane takes the whole pool, the even pages stay held, it finishes."""
    lease = pool.promise((pool.pages - pool.layout.state_pages) * ROWS)
    lease.take_state()
    lease.take(lease.window)
    hold = pool.hold(range(0, pool.pages, 2))
    lease.finish()
    return [hold]


def test_fragmentation_refuses_a_run_and_admits_pieces() -> None:
    pool = Pool(layout(), 20)
    holds = fragmented(pool)
    assert pool.free == 10 and pool.kept_pages == 10 and pool.census().free == 20
    run_lane = pool.promise(ROWS)  # 3 pages promised of the 10 free
    with pytest.raises(NoRun, match="no run of 2 consecutive free pages \\(10 pages are free\\)"):
        run_lane.claim_run()
    assert pool.free == 10  # the refusal took nothing
    run_lane.finish()
    pieces_lane = pool.promise(ROWS)
    pieces_lane.take_state()
    pieces_lane.take(ROWS)
    assert pieces_lane.state_pages == [1, 3] and pieces_lane.row_pages == [5]
    pieces_lane.finish()
    for hold in holds:
        hold.release()  # type: ignore[attr-defined]
        hold.release()  # type: ignore[attr-defined]
    pool.check_at_load()


def test_tables_written_together_land_on_leaving_whatever_raised() -> None:
    pool = Pool(layout(), 8)
    first, second = pool.promise(2 * ROWS), pool.promise(2 * ROWS)
    with pool.tables_together():
        first.take(ROWS)
        second.take(2 * ROWS)
        # the host tables at once; the device's on leaving
        assert first.host_table.tolist() == [0, pool.null_page] and second.host_table.tolist() == [1, 2]
        assert first.page_table.tolist() == second.page_table.tolist() == [pool.null_page] * 2
        with pytest.raises(RuntimeError, match="gathered already"), pool.tables_together():
            pass
    assert first.page_table.tolist() == [0, pool.null_page] and second.page_table.tolist() == [1, 2]
    with pytest.raises(KeyError), pool.tables_together():
        first.take(2 * ROWS)
        raise KeyError("a failure after the take")
    assert first.page_table.tolist() == first.host_table.tolist() == [0, 3]  # written all the same
    first.take(2 * ROWS)  # nothing gathered now: at once
    for lease in (first, second):
        lease.finish()
    pool.check_at_load()


def test_pages_off_holds_state_and_rows_on_one_run() -> None:
    pool = Pool(layout(), 10, mode=Mode.ONE_RUN)
    lease = pool.promise(3 * ROWS)
    with pytest.raises(PoolError, match="call it first"):
        lease.take(1)
    lease.open()
    assert lease.state_pages == [0, 1] and lease.row_pages == [2, 3, 4]
    assert lease.page_table.tolist() == lease.host_table.tolist() == [2, 3, 4]
    lease.take(3 * ROWS)  # already held
    assert lease.holds.may_take == 0
    lease.finish()
    pool.check_at_load()


def test_a_failed_take_leaves_the_pool_as_at_load() -> None:
    pool = Pool(layout(), 6)
    lease = pool.promise(2 * ROWS)
    with pytest.raises(OverPromise, match=r"asked for 33 rows; its window is 32"):
        lease.take(2 * ROWS + 1)
    with pytest.raises(PoolShort, match="needs 4 pages; 2 of 6 are free and unpromised"):
        pool.promise(2 * ROWS)
    lease.finish()
    pool.check_at_load()


def failing_write(error: BaseException) -> object:
    def init(pieces: Mapping[str, torch.Tensor]) -> None:
        pieces["a"].fill_(1.0)
        raise error
    return init


@pytest.mark.parametrize("error", [RuntimeError("device copy failed"), KeyboardInterrupt()])
@pytest.mark.parametrize("open_name", ["take_state", "claim_run"])
def test_a_failed_state_write_gives_the_pages_back(error: BaseException, open_name: str) -> None:
    # KeyboardInterrupt stands for anything arriving between taking the pages and placing the state.
    pool = Pool(layout(), 6)
    lease = pool.promise(ROWS)
    with pytest.raises(type(error)):
        getattr(lease, open_name)(failing_write(error))
    assert lease.state_pages == [] and lease.holds.may_take == 3 and pool.free == 6
    with pytest.raises(PoolError, match="no state yet"):
        lease.pieces  # noqa: B018
    lease.take_state()  # the lane can still open, on the same pages
    assert lease.state_pages == [0, 1]
    lease.finish()
    pool.check_at_load()


def test_a_cancel_after_open_leaves_the_pool_as_at_load() -> None:
    pool = Pool(layout(), 12)
    opened = pool.promise(4 * ROWS)
    opened.take_state()
    opened.take(ROWS + 3)
    promised_only = pool.promise(ROWS)
    assert pool.census() != pool.at_load
    opened.finish()
    promised_only.finish()
    pool.check_at_load()


def test_a_lane_left_open_is_a_leak() -> None:
    pool = Pool(layout(), 4)
    pool.promise(ROWS).take_state()
    with pytest.raises(Leak, match=r"LEAK: census .* differs from the census at load"):
        pool.check_at_load()


def test_holds_keep_pages_until_released() -> None:
    pool = Pool(layout(), 6)
    lease = pool.promise(2 * ROWS)
    lease.take_state()
    lease.take(2 * ROWS)
    kept = pool.hold(lease.row_pages)
    lease.finish()
    assert pool.free == 4 and pool.kept_pages == 2  # the hold is now the only holder
    assert pool.census().free == 6  # a page only kept states hold is a lane's for the asking
    with pytest.raises(ValueError, match="only taken pages can be held"):
        pool.hold([5])
    kept.release()
    pool.check_at_load()


def test_plan_fits_the_limit_and_one_lane_more_is_refused() -> None:
    small = layout(outside=(Piece("wide", (3000,), "uint8"),))
    window = 5 * ROWS
    lane = small.lane_bytes(window)
    assert lane == (2 + 5) * 1024 + 3000
    for limit in (lane + 1024, 3 * lane + 1100, 10 * lane + 1023):
        fits = small.plan(window, limit)
        pool = Pool.for_limit(small, limit, window)
        assert pool.max_lanes == fits
        lanes = [pool.promise(window) for _ in range(fits)]
        with pytest.raises(PoolShort):
            pool.promise(window)
        for lease in lanes:
            lease.finish()
        pool.check_at_load()
    with pytest.raises(PoolShort, match="3 lanes of 80 tokens do not fit 30000 bytes: 2 fit, each "
                       "needing 10168 bytes"):
        Pool.for_limit(small, 30_000, window, parallel=3)
    assert Pool.for_limit(small, 30_000, window, parallel=1).max_lanes == 1


def admitted_after_churn(mode: Mode, pages: int, long_window: int) -> int:
    """Lanes of 3 pages grow their rows a page a round, as concurrent decoding does; every
    other one finishes; then count the long lanes that open and fill their windows."""
    pool = Pool(layout(), pages, mode=mode)
    short = []
    while pool.can_promise(3 * ROWS):
        lease = pool.promise(3 * ROWS)
        lease.open()
        short.append(lease)
    for rows in (ROWS, 2 * ROWS, 3 * ROWS):
        for lease in short:
            lease.take(rows)
    for lease in short[::2]:
        lease.finish()
    admitted = 0
    while pool.can_promise(long_window):
        lease = pool.promise(long_window)
        try:
            lease.open()
        except NoRun:
            lease.finish()
            break
        lease.take(long_window)
        admitted += 1
    return admitted


def test_pieces_admit_at_least_as_many_lanes_as_runs(capsys: pytest.CaptureFixture[str]) -> None:
    small = layout()
    window = 4 * ROWS
    rows = ["limit KiB | plan | runs after churn | pieces after churn"]
    for limit_kib in range(12, 200, 7):
        limit = limit_kib * 1024
        pages = limit // small.page_bytes
        runs = admitted_after_churn(Mode.STATE_RUN, pages, window)
        pieces = admitted_after_churn(Mode.PIECES, pages, window)
        rows.append(f"{limit_kib:9} | {small.plan(window, limit):4} | {runs:16} | {pieces:18}")
        assert pieces >= runs
    with capsys.disabled():
        print("\n" + "\n".join(rows))


def test_the_load_report() -> None:
    pool = Pool.for_limit(layout(outside=(Piece("wide", (3000,), "uint8"),)), 100_000, 5 * ROWS)
    report = LoadReport.of(pool, 5 * ROWS)
    assert report.as_dict() == {
        "mode": "pieces", "page_rows": 16, "page_bytes": 1024, "row_bytes": 64.0, "pages": 70,
        "window": 80, "pieces_a_lane": 3, "piece_bytes_a_lane": 1400, "state_pages_a_lane": 2,
        "row_pages_a_lane": 5, "pages_a_lane": 7, "padding_bytes": 648, "padding_percent": 31.64,
        "fixed_bytes_a_lane": 3000, "outside": ("wide",), "lane_slots": 9, "lanes_that_fit": 9,
        "pool_bytes": 71 * 1024, "device": None,
    }
    assert report.line() == (
        "pool: 6.77e-05 GiB, 70 pages of 16 rows, 0.00 MiB each (pieces); a lane of 80 tokens: 3 pieces "
        "(0.00 MiB) on 2 pages, padding 0.00 MiB (31.64 %), plus 5 row pages = 7 pages; 0.00 MiB a lane "
        "outside the pool (wide); 9 lanes fit")


def test_the_load_report_on_a_gpu_says_what_went_where() -> None:
    pool = Pool.for_limit(layout(), 100_000, 5 * ROWS)
    plan = DevicePlan(40 * GIB, 139 * GIB, 18 * GIB, GIB // 2, GIB // 4, GIB, 2048)
    report = LoadReport.of(pool, 5 * ROWS, plan)
    assert report.line().endswith("; device: 40.00 GiB planned: weights 18.00, activations 0.50, graphs "
                                  "0.25, runtime 0.00, reserve 1.00, pool 0.00 GiB")
    measured = report.measured(engine_bytes_measured=GIB, free_after_warm_up_bytes=2 * GIB)
    assert measured.as_dict()["device"] == {**plan.as_dict(), "engine_bytes_measured": GIB,
                                            "free_after_warm_up_bytes": 2 * GIB}
    assert report.device == plan.as_dict()  # a report is a value: measured() makes another


OPERATIONS = st.lists(st.tuples(st.sampled_from(["promise", "open", "take", "finish", "hold", "release"]),
                                st.integers(0, 7), st.integers(1, 6 * ROWS)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(mode=st.sampled_from(list(Mode)), operations=OPERATIONS)
def test_any_sequence_keeps_the_books_and_ends_at_load(mode: Mode, operations: list[tuple[str, int, int]]
                                                       ) -> None:
    pool = Pool(layout(), 24, mode=mode)
    leases, holds = [], []
    for name, which, rows in operations:
        try:
            if name == "promise":
                leases.append(pool.promise(rows))
            elif name == "hold" and leases:
                held = [p for lease in leases for p in lease.row_pages][:which]
                holds.append(pool.hold(held))
            elif name == "release" and holds:
                holds.pop(which % len(holds)).release()
            elif leases:
                lease = leases[which % len(leases)]
                if name == "open":
                    lease.open()
                elif name == "take":
                    lease.take(min(rows, lease.window))
                else:
                    lease.finish()
                    leases.remove(lease)
        except (PoolShort, NoRun, PoolError):
            pass
        taken = {p for lease in leases for p in lease.row_pages + lease.state_pages}
        assert len(taken) == sum(len(lease.row_pages) + len(lease.state_pages) for lease in leases)
        assert pool.available >= 0
        assert pool.free <= pool.pages - len(taken)
    for lease in leases:
        lease.finish()
    for hold in holds:
        hold.release()
    pool.check_at_load()

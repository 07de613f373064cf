"""A verify round's bookkeeping launches give the bits of their torch references: the page tables in
the live rows, the kept count and the fed columns, the output row and the next round's window."""

from __future__ import annotations

import pytest
import torch

from tfd_kernels import round_columns

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FIXED, OFFSETS, PAGES, NULL = 6, 5, 7, 99


def round_columns_of(count: int, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed columns of ``count`` lanes of ``rows`` rows (lane 1 a narrower window, the last lane
    padding when there are three or more) and draws that hold a lane's drafts for a random stretch."""
    g = torch.Generator().manual_seed(seed)
    fields = FIXED + OFFSETS + PAGES
    packed = torch.randint(1, 1000, (fields, count * rows), generator=g)
    drawn = torch.randint(0, 6, (count * rows,), generator=g)
    for lane in range(count):
        columns = slice(lane * rows, (lane + 1) * rows)
        start = int(torch.randint(0, 500, (1,), generator=g))
        packed[1, columns] = start + torch.arange(rows)
        packed[2, columns] = start + 1 + torch.arange(rows)
        held = int(torch.randint(0, rows, (1,), generator=g))  # drafts 1..held equal the draw before
        tokens = torch.randint(0, 6, (rows,), generator=g)
        tokens[1:1 + held] = drawn[lane * rows:lane * rows + held]
        packed[0, columns] = tokens
        live = rows - 1 if lane == 1 and rows > 2 else rows
        if count >= 3 and lane == count - 1:
            live = 0
        packed[:, lane * rows + live:(lane + 1) * rows] = torch.tensor(
            [0, 0, 0, 0, 0, -1, *[-1] * OFFSETS, *[NULL] * PAGES])[:, None]
    return packed.to(DEVICE), drawn.to(DEVICE)


@pytest.mark.parametrize("count", [1, 3, 4])
@pytest.mark.parametrize("rows", [2, 3, 4, 9])
def test_the_round_launches_match_torch(count: int, rows: int) -> None:
    packed, drawn = round_columns_of(count, rows, seed=rows * 10 + count)
    table_field = FIXED + OFFSETS
    tables = torch.randint(0, 50, (PAGES, count), device=DEVICE)
    ours, theirs = packed.clone(), packed.clone()
    round_columns.tables(ours, tables, rows, table_field, NULL)
    round_columns.reference_tables(theirs, tables, rows, table_field, NULL)
    assert torch.equal(ours, theirs)
    assert (ours[table_field:, (ours[2] == 0)] == NULL).all()

    kept = round_columns.keep(ours, drawn, rows)
    want = round_columns.reference_keep(theirs, drawn, rows)
    for a, b in zip(kept, want, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert int(kept[0].min()) >= 1 and int(kept[0].max()) <= rows

    most = rows - 1
    g = torch.Generator().manual_seed(rows)
    drafts = torch.randint(0, 1000, (count, most), generator=g).to(DEVICE)
    proposed = torch.randint(1, most + 1, (count,), generator=g).to(DEVICE)
    limits = ours[1].view(count, rows)[:, 0] + torch.randint(0, 2 * rows, (count,), generator=g).to(DEVICE)
    padding = torch.tensor([0, 0, 0, 0, 0, -1, *[-1] * OFFSETS, *[NULL] * PAGES], device=DEVICE)
    last_row = 400
    out = round_columns.advance(ours, drawn, kept[0], drafts, proposed, limits, padding, last_row)
    want_out = round_columns.reference_advance(theirs, drawn, want[0], drafts, proposed, limits, padding,
                                               last_row)
    assert torch.equal(out, want_out) and torch.equal(ours, theirs)
    assert int(ours[1].max()) <= last_row


def test_a_window_must_be_one_row_more_than_the_drafts() -> None:
    packed, drawn = round_columns_of(2, 3, seed=1)
    with pytest.raises(ValueError, match="windows of 2 rows, got 3"):
        round_columns.advance(packed, drawn, torch.ones(2, dtype=torch.int64, device=DEVICE),
                              torch.zeros(2, 1, dtype=torch.int64, device=DEVICE),
                              torch.ones(2, dtype=torch.int64, device=DEVICE),
                              torch.zeros(2, dtype=torch.int64, device=DEVICE), packed[:, 0], 10)

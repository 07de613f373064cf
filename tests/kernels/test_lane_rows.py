"""Rows of decode lanes land at their element offsets; a lane at offset -1 stores nothing."""

from __future__ import annotations

import pytest
import torch

from tfd_kernels import lane_rows

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("store", [lane_rows.store, lane_rows.reference])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_rows_land_at_their_offsets_and_padding_stores_nothing(store: object, dtype: torch.dtype) -> None:
    pool = torch.zeros(3000, dtype=dtype, device=DEVICE)
    into = pool[500:].view(50, 50)[:, :40]  # a strided view: offsets count from its first element
    values = (torch.arange(3 * 1100, device=DEVICE) + 1).view(3, 1100).to(dtype)  # wider than a program
    at = torch.tensor([1200, -1, 7], device=DEVICE)
    store(values, into, at)  # type: ignore[operator]
    want = torch.zeros(3000, dtype=dtype)
    want[1700:2800] = values[0].cpu()
    want[507:1607] = values[2].cpu()
    assert torch.equal(pool.cpu(), want)


def test_a_view_of_the_projection_is_read_at_its_row_stride() -> None:
    pool = torch.zeros(64, device=DEVICE)
    projected = torch.randn(2, 24, device=DEVICE)
    lane_rows.store(projected[:, 16:], pool, torch.tensor([0, 30], device=DEVICE))
    assert torch.equal(pool[:8], projected[0, 16:]) and torch.equal(pool[30:38], projected[1, 16:])
    assert not pool[8:30].any() and not pool[38:].any()


def test_offsets_of_another_dtype_are_refused() -> None:
    with pytest.raises(ValueError, match="at is"):
        lane_rows.store(torch.zeros(2, 4), torch.zeros(16), torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="into is"):
        lane_rows.store(torch.zeros(2, 4), torch.zeros(16, dtype=torch.int64),
                        torch.zeros(2, dtype=torch.int64))

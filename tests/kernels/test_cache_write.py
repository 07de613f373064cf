"""K/V rows of decode lanes land on their pages; padding lanes write nothing."""

from __future__ import annotations

import pytest
import torch

from kernels import cache_write


def caches(device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """[5 pages + null, 4 rows, 2 heads, 8] views with a page stride wider than a page's rows."""
    pool = torch.zeros(6, 2, 4 * 2 * 8 + 16, device=device)
    return pool[:, 0, :64].view(6, 4, 2, 8), pool[:, 1, :64].view(6, 4, 2, 8)


@pytest.mark.parametrize("write", [cache_write.write, cache_write.reference])
def test_rows_land_at_each_lanes_last_position(write: object) -> None:
    k_cache, v_cache = caches()
    # k as the norm/rope kernel leaves it (contiguous), v a view of the projection's rows, read in place
    k, v = torch.randn(3, 2, 8), torch.randn(3, 40)[:, 24:].view(3, 2, 8)
    table = torch.tensor([[2, 0, 5], [4, 1, 5], [5, 5, 5]], dtype=torch.int32)
    lengths = torch.tensor([6, 3, 0], dtype=torch.int32)  # lane 2 pads
    write(k, v, k_cache, v_cache, table, lengths)  # type: ignore[operator]
    assert torch.equal(k_cache[0, 1], k[0]) and torch.equal(v_cache[0, 1], v[0])
    assert torch.equal(k_cache[4, 2], k[1]) and torch.equal(v_cache[4, 2], v[1])
    touched = k_cache.abs().sum((2, 3)) != 0
    assert touched.sum() == 2 and not k_cache[5].any() and not v_cache[5].any()


def test_caches_that_disagree_are_refused() -> None:
    k_cache, v_cache = caches()
    with pytest.raises(ValueError, match="disagree"):
        cache_write.write(torch.zeros(1, 3, 8), torch.zeros(1, 3, 8), k_cache, v_cache,
                          torch.zeros(1, 3, dtype=torch.int32), torch.ones(1, dtype=torch.int32))

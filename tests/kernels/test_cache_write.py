"""K/V rows of decode lanes land on their pages; padding lanes write nothing."""

from __future__ import annotations

import pytest
import torch

from tfd_kernels import cache_write, rope


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


@pytest.mark.parametrize(("dtype", "first"),
                         [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)])
def test_q_with_k_and_v_stored_in_one_launch_are_norm_rope_then_the_write(
        dtype: torch.dtype, first: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from tfd.model.rope import Rotary

    monkeypatch.setattr(rope, "LOADS_FIRST", first)  # the store's reads first, the pair's too: the same bits

    rotary = Rotary.of(8, 1.0, 10000.0)
    # [q|gate] heads, then k, then v: as the product lays them out
    projected = (torch.randn(3, 96, generator=torch.Generator().manual_seed(3)) * 2).to(dtype)
    query = projected[:, :64].view(3, 4, 16)[..., :8]
    key, value = projected[:, 64:80].view(3, 2, 8), projected[:, 80:].view(3, 2, 8)
    q_weight, k_weight = (torch.rand(8) * 0.2).to(dtype), (torch.rand(8) * 0.2).to(dtype)
    cos, sin = rotary.angles(torch.tensor([5, 2, 0]), dtype)
    table = torch.tensor([[2, 0, 5], [4, 1, 5], [5, 5, 5]], dtype=torch.int32)
    lengths = torch.tensor([6, 3, 0], dtype=torch.int32)  # lane 2 pads
    (k_cache, v_cache), (k_want, v_want) = (tuple(c.to(dtype) for c in caches()) for _ in range(2))
    q = rope.norm_rope_store(query, q_weight, key, k_weight, value, cos, sin, 1e-6, k_cache, v_cache, table,
                             lengths)
    q_want, k = rope.norm_rope_pair(query, q_weight, key, k_weight, cos, sin, 1e-6)
    cache_write.write(k, value, k_want, v_want, table, lengths)
    assert torch.equal(q, q_want) and torch.equal(k_cache, k_want) and torch.equal(v_cache, v_want)
    assert k_cache.abs().sum((2, 3)).count_nonzero() == 2  # two live lanes' rows, the padding lane's none

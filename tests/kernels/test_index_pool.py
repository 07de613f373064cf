"""A QSA decode row's raw index key stored and the block it completes pooled, in two launches: the
same bits as the span path's composition (torch's stores and mean, then rope.norm_rope)."""

from __future__ import annotations

import pytest
import torch

from tfd_kernels import index_pool

PAGE_ROWS, ENTRIES = 6, 4  # 6 rows a page: a block of 4 positions may straddle two pages
LANE_PAGES = 9  # a lane's page table row: 54 positions, 36 blocks' entries


def lane_pages(lanes: int, seed: int = 0) -> torch.Tensor:
    """int32 [lanes, LANE_PAGES]: each lane's own pages of the pool (page 0 is nobody's), shuffled."""
    order = torch.randperm(lanes * LANE_PAGES, generator=torch.Generator().manual_seed(seed)) + 1
    return order.view(lanes, LANE_PAGES).to(torch.int32)


def caches(lanes: int, dim: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """An index filled with earlier keys (the positions before each row's) and an empty pooled part."""
    g = torch.Generator().manual_seed(seed)
    index = torch.randn(1 + lanes * LANE_PAGES, PAGE_ROWS, dim, generator=g).to(dtype)
    return index, torch.zeros(1 + lanes * LANE_PAGES, ENTRIES, dim, dtype=dtype)


def angles(rotary: int, positions: int, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = torch.arange(positions).float()[:, None] * (10000.0 ** (-torch.arange(0, rotary, 2) / rotary))
    freqs = torch.cat((freqs, freqs), dim=-1)
    return freqs.cos().to(dtype).to(device), freqs.sin().to(dtype).to(device)


def both(keys: torch.Tensor, index: torch.Tensor, pooled: torch.Tensor, table: torch.Tensor,
         lengths: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, block: int
         ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """(index, pooled) after the two launches, and after the reference, from the same start."""
    got_index, got_pooled = index.clone(), pooled.clone()
    want_index, want_pooled = index.clone(), pooled.clone()
    index_pool.store(keys, got_index, table, lengths)
    index_pool.pool(got_index, got_pooled, table, lengths, weight, cos, sin, 1e-6, block)
    index_pool.reference(keys, want_index, want_pooled, table, lengths, weight, cos, sin, 1e-6, block)
    return (got_index, got_pooled), (want_index, want_pooled)


@pytest.mark.parametrize("block", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_on_both_sides_of_a_block_end_store_and_pool_as_the_composition(block: int,
                                                                             dtype: torch.dtype) -> None:
    dim, rotary = 16, 8  # a partial rotation: lanes past it pass through normed
    # lanes 0..6: padding, the first position, one short of a block's end, at it, one past it, at
    # the second block's end (at 4, positions 4..7 straddle a lane's first two pages), and far on
    lengths = torch.tensor([0, 1, block - 1, block, block + 1, 2 * block, 5 * block], dtype=torch.int32)
    index, pooled = caches(len(lengths), dim, dtype)
    table = lane_pages(len(lengths))
    keys = torch.randn(len(lengths), dim, generator=torch.Generator().manual_seed(5)).to(dtype)
    weight = (torch.randn(dim, generator=torch.Generator().manual_seed(6)) * 0.1).to(dtype)
    cos, sin = angles(rotary, LANE_PAGES * PAGE_ROWS, dtype, "cpu")
    got, want = both(keys, index, pooled, table, lengths, weight, cos, sin, block)
    assert torch.equal(got[0], want[0])
    if dtype == torch.float32:
        assert torch.equal(got[1], want[1])
    else:  # the interpreter rounds fp32 to bf16 its own way (the GPU test below holds the bits)
        assert torch.allclose(got[1].float(), want[1].float(), rtol=2 ** -7, atol=2 ** -9)
    for row, length in enumerate(lengths.tolist()):  # each live row's key at its position
        if length:
            page, slot = table[row, (length - 1) // PAGE_ROWS], (length - 1) % PAGE_ROWS
            assert torch.equal(got[0][page, slot], keys[row])
    assert torch.equal(got[0][table[0].long()], index[table[0].long()])  # the padding lane's pages untouched
    completing = [row for row, length in enumerate(lengths.tolist()) if length and length % block == 0]
    assert completing == [3, 5, 6]
    written = {(int(table[r, (lengths[r] // block - 1) // ENTRIES]), int(lengths[r] // block - 1) % ENTRIES)
               for r in completing}
    assert {(int(p), int(e)) for p, e in got[1].abs().sum(-1).nonzero()} == written  # no other row pools


def test_a_window_pools_the_keys_its_earlier_rows_store_in_the_same_call() -> None:
    """A verify window: one lane's rows at four consecutive positions, the last ending a block whose
    first three keys the same store launch writes (the index held other values there before)."""
    dim, block = 16, 4
    index, pooled = caches(1, dim, torch.float32)
    table = lane_pages(1).expand(4, -1).contiguous()
    lengths = torch.tensor([5, 6, 7, 8], dtype=torch.int32)  # positions 4..7: block 1, across two pages
    keys = torch.randn(4, dim, generator=torch.Generator().manual_seed(9))
    cos, sin = angles(dim, LANE_PAGES * PAGE_ROWS, torch.float32, "cpu")
    got, want = both(keys, index, pooled, table, lengths, torch.zeros(dim), cos, sin, block)
    assert torch.equal(got[1], want[1])
    mean = keys.sum(dim=0) / block  # the new keys', not what the index held before the call
    normed = mean * torch.rsqrt(mean.square().mean() + 1e-6)
    turned = torch.cat((-normed[dim // 2:], normed[:dim // 2]))
    assert torch.allclose(got[1][table[0, 0], 1], normed * cos[4] + turned * sin[4], atol=1e-5)


def test_inputs_that_do_not_fit_are_refused_by_name() -> None:
    index, pooled = caches(2, 16, torch.float32)
    table, lengths = lane_pages(2), torch.tensor([1, 2], dtype=torch.int32)
    cos, sin = angles(16, 54, torch.float32, "cpu")
    with pytest.raises(ValueError, match="page_table must be int32"):
        index_pool.store(torch.zeros(2, 16), index, table.long(), lengths)
    with pytest.raises(ValueError, match="lengths is"):
        index_pool.store(torch.zeros(2, 16), index, table, lengths[:1])
    with pytest.raises(ValueError, match=r"keys torch\.bfloat16"):
        index_pool.store(torch.zeros(2, 16, dtype=torch.bfloat16), index, table, lengths)
    with pytest.raises(ValueError, match=r"pooled torch.float32 \[19, 4, 8\]"):
        index_pool.pool(index, pooled[..., :8], table, lengths, torch.zeros(16), cos, sin, 1e-6, 4)
    with pytest.raises(ValueError, match="block 0"):
        index_pool.pool(index, pooled, table, lengths, torch.zeros(16), cos, sin, 1e-6, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("block", [4, 2])
def test_on_the_gpu_the_launches_have_the_compositions_bits(block: int) -> None:
    """Flash Next's sizes (keys of 128, a rotation of 64, bf16), 40 lanes at lengths around block
    ends and pages' ends: the span path pools through rope.norm_rope, so a decode block must match."""
    dim, lanes = 128, 40
    index, pooled = (t.cuda() for t in caches(lanes, dim, torch.bfloat16, seed=3))
    lengths = torch.tensor([0, 1, 3, 4, 5, 6, 7, 8, 12, 24, 25, 28, 36, 48, 52, 53, 54] * 3,
                           dtype=torch.int32)[:lanes].cuda()
    keys = torch.randn(lanes, dim, generator=torch.Generator().manual_seed(4)).bfloat16().cuda()
    weight = (torch.randn(dim, generator=torch.Generator().manual_seed(6)) * 0.1).bfloat16().cuda()
    cos, sin = angles(64, LANE_PAGES * PAGE_ROWS, torch.bfloat16, "cuda")
    got, want = both(keys, index, pooled, lane_pages(lanes).cuda(), lengths, weight, cos, sin, block)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

"""QSA block scores: the kernel against the torch reference, -inf past a row's complete blocks, and
a row's scores the same whatever else the call scores."""

from __future__ import annotations

import pytest
import torch

from tfd_kernels import block_scores

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def case(rows: int, heads: int, dim: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Queries, a pooled part of 12 pages (+ null) of 4 entries, two lanes' tables, owners, counts."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, heads, dim, generator=g).to(dtype)
    pooled = torch.randn(13, 4, dim, generator=g).to(dtype)
    pooled[12] = 0  # the null page
    page_table = torch.stack([torch.randperm(12, generator=g)[:10] for _ in range(2)]).int()
    lane_of = torch.tensor([row % 2 for row in range(rows)], dtype=torch.int32)
    complete = torch.randint(0, 41, (rows,), generator=g)
    return q, pooled, page_table, lane_of, complete


@pytest.mark.parametrize(("heads", "dim"), [(2, 8), (4, 16), (3, 20)])
def test_the_kernel_scores_as_the_reference(heads: int, dim: int) -> None:
    args = case(5, heads, dim, torch.float32)
    want = block_scores.reference(*args, 40)
    got = block_scores.scores(*[x.to(DEVICE) for x in args], 40).cpu()
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("score", [block_scores.scores, block_scores.reference])
def test_blocks_past_the_complete_ones_score_minus_infinity(score: object) -> None:
    q, pooled, table, lane_of, _ = case(3, 2, 8, torch.float32)
    complete = torch.tensor([0, 5, 40])
    got = score(*[x.to(DEVICE) for x in (q, pooled, table, lane_of, complete)], 40).cpu()  # type: ignore[operator]
    for row, done in enumerate(complete.tolist()):
        assert torch.isinf(got[row, done:]).all() and torch.isfinite(got[row, :done]).all()
        assert (got[row, :done] >= 0).all()  # sums of ReLUs


@pytest.mark.parametrize(("score", "device"), [(block_scores.scores, DEVICE),
                                               (block_scores.reference, "cpu")])  # the reference for the CPU
def test_a_row_scores_the_same_alone_and_over_fewer_blocks(score: object, device: str) -> None:
    q, pooled, table, lane_of, complete = (x.to(device) for x in case(6, 4, 16, torch.float32))
    together = score(q, pooled, table, lane_of, complete, 40)  # type: ignore[operator]
    done = int(complete[3])
    alone = score(q[3:4], pooled, table, lane_of[3:4], complete[3:4], done)  # type: ignore[operator]
    assert torch.equal(alone[0], together[3, :done])


def test_owners_of_another_dtype_are_refused() -> None:
    q, pooled, table, lane_of, complete = case(2, 2, 8, torch.float32)
    with pytest.raises(ValueError, match="lane_of"):
        block_scores.scores(q, pooled, table, lane_of.float(), complete, 8)


@pytest.mark.gpu
def test_real_sizes_on_the_device() -> None:
    """Flash Next's indexer: four heads of 128, bf16 pooled keys, 16 blocks a page of 64 rows."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(8, 4, 128, generator=g).bfloat16()
    pooled = torch.randn(41, 16, 128, generator=g).bfloat16()
    table = torch.stack([torch.randperm(40, generator=g)[:32] for _ in range(8)]).int()
    lane_of = torch.arange(8, dtype=torch.int32)
    complete = torch.randint(0, 513, (8,), generator=g)
    want = block_scores.reference(q, pooled, table, lane_of, complete, 512)
    got = block_scores.scores(*(x.cuda() for x in (q, pooled, table, lane_of, complete)), 512).cpu()
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

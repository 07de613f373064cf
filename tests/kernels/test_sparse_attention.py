"""Attention over each row's own key positions: the kernel against the torch reference, whole and in
decode's segments (counts either side of a segment's end, several segments, one)."""

from __future__ import annotations

import pytest
import torch

from tfd_kernels import sigmoid_gate, sparse_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def case(rows: int, heads: int, kv_heads: int, dim: int, dtype: torch.dtype, seed: int = 0,
         counts: list[int] | None = None) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    page_rows, pages = 16, 40
    q = torch.randn(rows, heads, dim, generator=g).to(dtype)
    k_cache = torch.randn(pages + 1, page_rows, kv_heads, dim, generator=g).to(dtype)
    v_cache = torch.randn(pages + 1, page_rows, kv_heads, dim, generator=g).to(dtype)
    page_table = torch.stack([torch.randperm(pages, generator=g)[:20] for _ in range(2)]).int()
    lane_of = torch.tensor([row % 2 for row in range(rows)], dtype=torch.int32)
    width = 150
    drawn = torch.randint(1, width + 1, (rows,), generator=g, dtype=torch.int32)
    counts = drawn if counts is None else torch.tensor(counts, dtype=torch.int32)
    positions = torch.full((rows, width), -1, dtype=torch.int32)
    for row in range(rows):  # ascending distinct positions, the rest padding
        chosen = torch.randperm(320, generator=g)[:int(counts[row])].sort().values
        positions[row, :len(chosen)] = chosen.int()
    return q, k_cache, v_cache, page_table, lane_of, positions, counts


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(4, 2, 16), (6, 2, 32)])
def test_the_kernel_attends_as_the_reference(heads: int, kv_heads: int, dim: int) -> None:
    args = case(5, heads, kv_heads, dim, torch.float32)
    want = sparse_attention.reference(*args, 0.3, torch.empty_like(args[0]))
    moved = [x.to(DEVICE) for x in args]
    got = sparse_attention.attend(*moved, 0.3, torch.empty_like(moved[0]))
    assert torch.allclose(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_a_row_is_the_same_alone() -> None:
    q, k_cache, v_cache, table, lane_of, positions, counts = (
        x.to(DEVICE) for x in case(6, 4, 2, 16, torch.float32))
    together = sparse_attention.attend(q, k_cache, v_cache, table, lane_of, positions, counts, 0.3,
                                       torch.empty_like(q))
    alone = sparse_attention.attend(q[3:4], k_cache, v_cache, table, lane_of[3:4], positions[3:4],
                                    counts[3:4], 0.3, torch.empty_like(q[3:4]))
    assert torch.equal(alone[0], together[3])


def test_refuses_positions_of_another_dtype() -> None:
    q, k_cache, v_cache, table, lane_of, positions, counts = case(2, 4, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="positions"):
        sparse_attention.attend(q, k_cache, v_cache, table, lane_of, positions.long(), counts, 0.3, q.clone())


@pytest.mark.parametrize("segment", [16, 64])  # 150-wide rows in ten segments; in three
def test_decode_rows_in_segments_attend_as_the_reference(segment: int,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sparse_attention, "SEGMENT", segment)
    args = case(7, 6, 2, 32, torch.float32, seed=2, counts=[1, 16, 17, 32, 33, 64, 150])  # segments' ends
    q, k_cache, v_cache, table, lane_of, positions, counts = args
    want = sparse_attention.reference(*args, 0.3, torch.empty_like(q))
    got = sparse_attention.attend(*args, 0.3, torch.empty_like(q), split=True)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    for row in (0, 4, 6):
        alone = sparse_attention.attend(q[row:row + 1], k_cache, v_cache, table, lane_of[row:row + 1],
                                        positions[row:row + 1], counts[row:row + 1], 0.3,
                                        torch.empty_like(q[row:row + 1]), split=True)
        assert torch.equal(alone[0], got[row])


def test_decode_rows_gated_in_the_merge_are_the_gate_on_the_plain_output() -> None:
    q, k_cache, v_cache, table, lane_of, positions, counts = case(5, 6, 2, 32, torch.bfloat16, seed=5)
    gate = torch.randn(5, 6, 64, generator=torch.Generator().manual_seed(6)).bfloat16()[:, :, ::2]  # strided
    with pytest.raises(ValueError, match="unit last stride"):
        sparse_attention.attend(q, k_cache, v_cache, table, lane_of, positions, counts, 0.3,
                                torch.empty_like(q), split=True, gate=gate)
    gate = gate.contiguous()
    plain = sparse_attention.attend(q, k_cache, v_cache, table, lane_of, positions, counts, 0.3,
                                    torch.empty_like(q), split=True)
    got = sparse_attention.attend(q, k_cache, v_cache, table, lane_of, positions, counts, 0.3,
                                  torch.empty_like(q), split=True, gate=gate)
    want = sigmoid_gate.sigmoid_gate(plain.reshape(5, -1), gate).reshape(plain.shape)  # as attention.finish
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="without split"):
        sparse_attention.attend(q, k_cache, v_cache, table, lane_of, positions, counts, 0.3,
                                torch.empty_like(q), gate=gate)


@pytest.mark.gpu
def test_real_heads_on_the_device() -> None:
    args = case(33, 24, 2, 256, torch.bfloat16, seed=3)
    want = sparse_attention.reference(*args, 1 / 16, torch.empty_like(args[0])).float()
    moved = [x.cuda() for x in args]
    got = sparse_attention.attend(*moved, 1 / 16, torch.empty_like(moved[0])).cpu().float()
    # paged attention's bf16 bound: the kernel rounds each block's weights to bf16 before p @ v
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_real_heads_in_segments_on_the_device() -> None:
    """Flash Next's heads (24 over 2 kv heads of 256) in decode's segments: within paged attention's
    bf16 bound of the reference, gated in the merge as the gate's own kernel gates, and a row alone
    as in the batch."""
    segment = sparse_attention.SEGMENT  # a row of one segment, of one and a position, then longer
    args = case(33, 24, 2, 256, torch.bfloat16, seed=4, counts=[segment, segment + 1, *range(120, 151, 1)])
    want = sparse_attention.reference(*args, 1 / 16, torch.empty_like(args[0])).float()
    q, k_cache, v_cache, table, lane_of, positions, counts = (x.cuda() for x in args)
    got = sparse_attention.attend(q, k_cache, v_cache, table, lane_of, positions, counts, 1 / 16,
                                  torch.empty_like(q), split=True)
    torch.testing.assert_close(got.cpu().float(), want, rtol=2e-2, atol=2e-2)
    gate = torch.randn(q.shape, device="cuda").bfloat16()
    gated = sparse_attention.attend(q, k_cache, v_cache, table, lane_of, positions, counts, 1 / 16,
                                    torch.empty_like(q), split=True, gate=gate)
    assert torch.equal(gated, sigmoid_gate.sigmoid_gate(got.reshape(33, -1), gate).reshape(got.shape))
    for row in (0, 1, 17, 32):
        alone = sparse_attention.attend(q[row:row + 1], k_cache, v_cache, table, lane_of[row:row + 1],
                                        positions[row:row + 1], counts[row:row + 1], 1 / 16,
                                        torch.empty_like(q[row:row + 1]), split=True)
        assert torch.equal(alone[0], got[row])

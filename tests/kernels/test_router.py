"""The router's one-launch top-k against its torch form: the same experts, the same weights."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from tfd_kernels import router

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def logits(rows: int, experts: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, experts, generator=torch.Generator().manual_seed(seed)) * 2


@pytest.mark.parametrize(("experts", "k", "normalise"), [(16, 4, True), (60, 6, False), (256, 8, True)])
def test_the_kernel_chooses_as_torch(experts: int, k: int, normalise: bool) -> None:
    x = logits(5, experts, experts)
    chosen, weights = router.top_k(x.to(DEVICE), k, normalise, torch.float32)
    want_chosen, want_weights = router.reference(x, k, normalise, torch.float32)
    assert torch.equal(chosen.cpu(), want_chosen)
    assert torch.allclose(weights.cpu(), want_weights, rtol=1e-6, atol=1e-7)
    if normalise:
        assert torch.allclose(weights.sum(-1).cpu(), torch.ones(5), atol=1e-6)


def test_equal_probabilities_go_to_the_lower_expert() -> None:
    x = torch.zeros(1, 16)
    x[0, [9, 2, 5]] = 3.0
    chosen, _ = router.top_k(x.to(DEVICE), 4, True, torch.float32)
    assert chosen[0, :3].tolist() == [2, 5, 9]
    assert chosen[0, 3].item() == 0  # then the lowest of the rest, all equal


def test_a_row_chooses_the_same_alone() -> None:
    x = logits(6, 64, 3).to(DEVICE)
    chosen, weights = router.top_k(x, 5, True, torch.float32)
    alone = router.top_k(x[4:5], 5, True, torch.float32)
    assert torch.equal(alone[0][0], chosen[4]) and torch.equal(alone[1][0], weights[4])


def test_refuses_more_experts_than_there_are() -> None:
    with pytest.raises(ValueError, match="k is 9"):
        router.top_k(torch.zeros(2, 8), 9, True, torch.float32)


@triton.jit
def _both_forms(logits, ids, weights, experts, K: tl.constexpr, NORM: tl.constexpr, BLOCK: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """Each row's choice by both forms, all BLOCK_K slots: the rounds' at [0, row], the merged at [1, row]."""
    row, rows = tl.program_id(0), tl.num_programs(0)
    slots = tl.arange(0, BLOCK_K)
    x = router.row_logits(logits + row * experts, experts, BLOCK, "")
    best, picked = router.choice_rounds(x, experts, K, NORM, BLOCK, BLOCK_K)
    tl.store(ids + row * BLOCK_K + slots, best)
    tl.store(weights + row * BLOCK_K + slots, picked)
    best, picked = router.choice_merged(x, experts, K, NORM, BLOCK, BLOCK_K)
    tl.store(ids + (rows + row) * BLOCK_K + slots, best)
    tl.store(weights + (rows + row) * BLOCK_K + slots, picked)


def hard_rows(experts: int, seed: int) -> torch.Tensor:
    """Rows that test the order: exact ties (few distinct values, a tied top, all equal), probabilities
    that underflow to zero (ties among them), one expert far ahead, random; last, logits an ulp or two
    apart, whose probabilities may round to equal ones."""
    g = torch.Generator().manual_seed(seed)
    few = torch.randint(-3, 4, (3, experts), generator=g).float() / 2
    tied_top = torch.randn(1, experts, generator=g)
    tied_top[0, torch.randperm(experts, generator=g)[:5]] = 4.0
    underflow = torch.randn(1, experts, generator=g) * 60
    ahead = torch.randn(1, experts, generator=g)
    ahead[0, experts // 3] = 90.0
    spread = torch.randn(2, experts, generator=g) * 3
    near = 1 + torch.randint(0, 3, (1, experts), generator=g) * 2.0 ** -23
    return torch.cat([few, tied_top, torch.zeros(1, experts), underflow, ahead, spread, near])


@pytest.mark.parametrize("normalise", [True, False])
@pytest.mark.parametrize("k", [1, 2, 4, 8, 10])
@pytest.mark.parametrize("experts", [8, 60, 64, 128, 256, 512])
def test_both_forms_choose_alike(experts: int, k: int, normalise: bool) -> None:
    if k > experts:
        pytest.skip("k is past the experts")
    x = hard_rows(experts, experts * 100 + k).to(DEVICE)
    rows, slots = x.shape[0], triton.next_power_of_2(k)
    ids = torch.full((2, rows, slots), -7, dtype=torch.int64, device=DEVICE)
    weights = torch.full((2, rows, slots), -7.0, device=DEVICE)
    _both_forms[(rows,)](x, ids, weights, experts, K=k, NORM=normalise, BLOCK=triton.next_power_of_2(experts),
                         BLOCK_K=slots, num_warps=router.ROUTE_WARPS)
    assert torch.equal(ids[1], ids[0])
    if DEVICE == "cpu":  # torch's softmax may round the last row's neighbours otherwise
        assert torch.equal(ids[0, :-1, :k], router.reference(x[:-1], k, normalise, torch.float32)[0])
    assert not ids[:, :, k:].any() and not weights[:, :, k:].any()  # slots past k hold zero
    if normalise and DEVICE == "cuda":  # the k weights' sum may add in another order
        assert torch.allclose(weights[1], weights[0], rtol=2 ** -22, atol=0)
    else:  # the same probabilities, and the interpreter sums k weights in slot order in both forms
        assert torch.equal(weights[1], weights[0])


def test_k_past_a_warp() -> None:
    x = hard_rows(512, 5)[:-1]  # the last row: see test_both_forms_choose_alike
    chosen, weights = router.top_k(x.to(DEVICE), 40, True, torch.float32)
    want_chosen, want_weights = router.reference(x, 40, True, torch.float32)
    assert torch.equal(chosen.cpu(), want_chosen)
    assert torch.allclose(weights.cpu(), want_weights, rtol=1e-6, atol=1e-7)


@pytest.mark.gpu
@pytest.mark.parametrize(("experts", "k"), [(256, 8), (512, 10)])
def test_real_routers_on_the_device(experts: int, k: int) -> None:
    x = logits(64, experts, k).to(torch.bfloat16)
    chosen, weights = router.top_k(x.cuda(), k, True, torch.bfloat16)
    want_chosen, want_weights = router.reference(x, k, True, torch.bfloat16)
    assert torch.equal(chosen.cpu(), want_chosen)
    assert torch.allclose(weights.cpu().float(), want_weights.float(), rtol=2 ** -7, atol=1e-4)
    assert torch.equal(router.top_k(x[:3].cuda(), k, True, torch.bfloat16)[1], weights[:3])

"""The router's one-launch top-k against its torch form: the same experts, the same weights."""

from __future__ import annotations

import pytest
import torch

from kernels import router

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


@pytest.mark.gpu
@pytest.mark.parametrize(("experts", "k"), [(256, 8), (512, 10)])
def test_real_routers_on_the_device(experts: int, k: int) -> None:
    x = logits(64, experts, k).to(torch.bfloat16)
    chosen, weights = router.top_k(x.cuda(), k, True, torch.bfloat16)
    want_chosen, want_weights = router.reference(x, k, True, torch.bfloat16)
    assert torch.equal(chosen.cpu(), want_chosen)
    assert torch.allclose(weights.cpu().float(), want_weights.float(), rtol=2 ** -7, atol=1e-4)
    assert torch.equal(router.top_k(x[:3].cuda(), k, True, torch.bfloat16)[1], weights[:3])

"""Row norms against the model's torch references, and their batch invariance."""

from __future__ import annotations

import pytest
import torch

from tfd.model import ops
from tfd_kernels import norm


def rand(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zrms_matches_the_reference(dtype: torch.dtype) -> None:
    x, w = rand(5, 48, dtype=dtype), rand(48, seed=1, dtype=dtype) * 0.1
    got, want = norm.zrms(x, w, 1e-6).float(), ops.zrms(x, w, 1e-6).float()
    tolerance = 1e-6 if dtype == torch.float32 else 2 ** -7
    assert ((got - want).abs() <= tolerance * (1 + want.abs())).all()


@pytest.mark.parametrize("group", [16, 20, 40])
@pytest.mark.parametrize("shared", [False, True])
def test_grouped_zrms_normalises_each_group_with_a_whole_row_or_one_group_weight(group: int,
                                                                                shared: bool) -> None:
    # 16 fills its power-of-two block; 20 and 40 do not (Flash Next's streams are 2,560 wide): groups
    # lie a width apart, not a block apart, and the last row's last group ends at the tensor's end
    x = rand(3, 4 * group)
    w = rand(group if shared else 4 * group, seed=2) * 0.1
    whole = w.repeat(4) if shared else w  # the reference takes the whole row's weight
    got, want = norm.zrms(x, w, 1e-6, group=group), ops.zrms(x, whole, 1e-6, group=group)
    assert torch.allclose(got, want, atol=1e-6)
    batch = rand(5, 4 * group, seed=3)
    alone, together = norm.zrms(batch[4:], w, 1e-6, group=group), norm.zrms(batch, w, 1e-6, group=group)
    assert torch.equal(alone[0], together[4])


@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
def test_gated_rms_matches_the_reference(activation: str) -> None:
    x, gate, w = rand(4, 3, 32), rand(4, 3, 32, seed=1), 1 + rand(32, seed=2) * 0.1
    got = norm.gated_rms(x, gate, w, 1e-6, activation)
    assert torch.allclose(got, ops.gated_rms(x, gate, w, 1e-6, activation), atol=1e-6)
    fused = torch.cat([rand(4, 40, seed=3), gate.reshape(4, -1)], dim=1)  # the gate read in place
    sliced = fused[:, 40:].view(4, 3, 32)
    assert sliced.stride(0) == 136 and torch.equal(norm.gated_rms(x, sliced, w, 1e-6, activation), got)
    x, gate = rand(2, 6, 32, seed=4), rand(2, 6, 32, seed=5)  # heads over a program's block, the last partial
    want = ops.gated_rms(x, gate, w, 1e-6, activation)
    assert torch.allclose(norm.gated_rms(x, gate, w, 1e-6, activation), want, atol=1e-6)


def test_rows_do_not_depend_on_the_batch() -> None:
    x, w = rand(6, 40), rand(40, seed=1)
    batch = norm.zrms(x, w, 1e-6)
    assert torch.equal(norm.zrms(x[2:3], w, 1e-6)[0], batch[2])


@pytest.mark.gpu
def test_real_widths_on_the_device() -> None:
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16) * 0.1
    batch = norm.zrms(x, w, 1e-6)
    for m in (1, 3, 17):
        assert torch.equal(norm.zrms(x[:m], w, 1e-6), batch[:m])
    want = ((x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)) * (1 + w.float()))
    assert ((batch.float() - want).abs() <= 2 ** -7 * (1 + want.abs())).all()
    o = torch.randn(64, 32, 128, device="cuda")
    gate = torch.randn(64, 32, 128, device="cuda", dtype=torch.bfloat16)
    ones = torch.ones(128, device="cuda", dtype=torch.bfloat16)
    gated = norm.gated_rms(o, gate, ones, 1e-6, "silu")
    assert torch.equal(norm.gated_rms(o[:5], gate[:5], ones, 1e-6, "silu"), gated[:5])
    # an fp32 input is rounded to the model dtype first (the interpreter truncates instead: GPU only)
    assert torch.equal(gated, norm.gated_rms(o.bfloat16(), gate, ones, 1e-6, "silu"))
    # the decode path's residual add + norm gives the prompt path's add then norm, bit for bit
    delta = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    total, normed = norm.add_zrms(x, delta, w, 1e-6)
    assert torch.equal(total, x + delta) and torch.equal(normed, norm.zrms(x + delta, w, 1e-6))


def test_add_zrms_is_the_sum_and_its_norm() -> None:
    x, delta, w = rand(3, 40), rand(3, 40, seed=1), rand(40, seed=2) * 0.1
    total, normed = norm.add_zrms(x, delta, w, 1e-6)
    assert torch.allclose(total, x + delta, atol=1e-6)
    assert torch.allclose(normed, ops.zrms(x + delta, w, 1e-6), atol=1e-5)


def early_and_late(monkeypatch: pytest.MonkeyPatch, device: str, width: int) -> None:
    """Each norm's outputs with its weight asked for before the wait are those without."""
    x, delta = rand(3, width).to(device), rand(3, width, seed=1).to(device)
    w, head_w = (rand(width, seed=2) * 0.1).to(device), (1 + rand(32, seed=3) * 0.1).to(device)
    o, gate = rand(3, 6, 32, seed=4).to(device), rand(3, 6, 32, seed=5).to(device)

    def norms() -> list[torch.Tensor]:
        return [norm.zrms(x, w, 1e-6), norm.zrms(x, w[:32], 1e-6, group=32),
                *norm.add_zrms(x, delta, w, 1e-6), norm.gated_rms(o, gate, head_w, 1e-6, "silu")]

    monkeypatch.setattr(norm, "WEIGHTS_EARLY", False)
    want = norms()
    monkeypatch.setattr(norm, "WEIGHTS_EARLY", True)
    for got, expected in zip(norms(), want, strict=True):
        assert torch.equal(got, expected)


def test_weights_asked_for_before_the_wait_give_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    early_and_late(monkeypatch, "cpu", 64)


@pytest.mark.gpu
def test_weights_asked_for_before_the_wait_on_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    early_and_late(monkeypatch, "cuda", 2048)

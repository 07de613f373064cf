"""The MoE block: CUDA's path (``grouped_moe``, the grouped kernels, run here in Triton's interpreter)
against the CPU reference path ``moe`` takes here, and a row's bits whatever the batch; the CPU path's
experts taken together against the same products a (row, expert) pair at a time."""

from __future__ import annotations

import attrs
import pytest
import torch

from tfd.model.fp8 import Joined, quantize_experts, quantize_weight
from tfd.model.mlp import DenseMlp, MoeWeights, grouped_moe, moe, routed_reference
from tfd.model.ops import linear, silu
from tfd_kernels import router

EXPERTS, TOP_K, HIDDEN, INNER = 8, 4, 64, 32
# The CPU path sums the routed experts in the model dtype and rounds each SwiGLU step; the kernels
# round each weighted term, sum those in fp32 and round the middle once: in bf16 a few units in the last
# place of the output.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 3e-2}


def weights(shared_inner: int, dtype: torch.dtype, seed: int = 0, inner: int = INNER) -> MoeWeights:
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) / shape[-1] ** 0.5).to(dtype)

    shared = DenseMlp(randn(2 * shared_inner, HIDDEN), randn(HIDDEN, shared_inner))
    return MoeWeights(router=randn(EXPERTS + 1, HIDDEN) * 4, gate_up=randn(EXPERTS, 2 * inner, HIDDEN),
                      down=randn(EXPERTS, HIDDEN, inner), shared=shared, top_k=TOP_K, norm_top_k=True)


def rows(count: int, dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    return torch.randn(count, HIDDEN, generator=torch.Generator().manual_seed(seed)).to(dtype)


def grouped(w: MoeWeights, x: torch.Tensor) -> torch.Tensor:
    return grouped_moe(w, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shared_inner", [INNER, 48])  # the real models' equal sizes; the tiny models' 48
@pytest.mark.parametrize("count", [1, 6, 40])  # 40 rows of top-4: past one planning block
def test_the_grouped_path_is_the_cpu_path(count: int, shared_inner: int, dtype: torch.dtype) -> None:
    w, x = weights(shared_inner, dtype), rows(count, dtype)
    want = moe(w, x)
    got = grouped(w, x)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
    # the shared expert is in both: without it the block is far from either
    unshared = attrs.evolve(w, shared=DenseMlp(w.shared.gate_up * 0, w.shared.down))
    assert not torch.allclose(grouped(unshared, x), want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_grouped_row_is_the_same_alone_and_in_any_batch(dtype: torch.dtype) -> None:
    w, x = weights(INNER, dtype), rows(40, dtype)
    batch = grouped(w, x)
    for first, stop in ((0, 1), (0, 2), (3, 8), (39, 40)):
        assert torch.equal(grouped(w, x[first:stop]), batch[first:stop])


def test_a_paired_shared_expert_is_refused() -> None:
    """The grouped kernels read the shared expert's gate rows, then its up rows."""
    w = weights(INNER, torch.float32)
    with pytest.raises(ValueError, match=r"^shared must keep gate rows then up rows"):
        attrs.evolve(w, shared=DenseMlp(w.shared.gate_up, w.shared.down, paired=True))


def fp8_weights(shared_inner: int, dtype: torch.dtype) -> MoeWeights:
    """``weights`` with the experts and the shared expert in block-wise FP8 (its fused gate|up one weight)."""
    w = weights(shared_inner, dtype)
    shared = DenseMlp(quantize_weight(w.shared.gate_up), quantize_weight(w.shared.down))
    return attrs.evolve(w, gate_up=quantize_experts(w.gate_up), down=quantize_experts(w.down), shared=shared)


@pytest.mark.parametrize("count", [1, 6, 40])
def test_fp8_experts_in_the_grouped_path_are_the_cpu_paths_within_their_rounding(count: int) -> None:
    # Both quantize a row per 128-group and sum K blocks in order; the kernels form SwiGLU's middle in fp32
    # and sum the experts in fp32, where the CPU rounds each step to the model dtype: fp32 here, so the
    # float path's tolerance holds (measured 4e-8 to 8e-8 of the largest output; an e4m3 rounding of the
    # middle that flipped would show as 2^-4 of one element, far past it)
    w, x = fp8_weights(48, torch.float32), rows(count, torch.float32)
    want, got = moe(w, x), grouped(w, x)
    torch.testing.assert_close(got, want, rtol=TOLERANCE[torch.float32], atol=TOLERANCE[torch.float32])
    batch = grouped(w, rows(40, torch.float32))
    assert torch.equal(grouped(w, rows(40, torch.float32)[3:3 + count]), batch[3:3 + count])


def test_a_shared_expert_whose_gate_and_up_stay_apart_in_fp8_is_refused_by_the_kernels() -> None:
    w = fp8_weights(48, torch.float32)
    gate, up = w.shared.gate_up.dequantized()[:48], w.shared.gate_up.dequantized()[48:]  # type: ignore[union-attr]
    joined = Joined((quantize_weight(gate), quantize_weight(up)))  # 48 rows each: blocks of their own
    apart = attrs.evolve(w, shared=DenseMlp(joined, w.shared.down))
    with pytest.raises(ValueError, match=r"one float or FP8 weight a product, not Joined"):
        grouped(apart, rows(2, torch.float32))


def pair_by_pair(w: MoeWeights, x: torch.Tensor, experts: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """The routed sum one (row, expert) pair at a time, each row's experts in ascending id, skipping the
    experts not held: what ``routed_reference`` must equal bit for bit."""
    routed, inner = torch.zeros_like(x), w.down.shape[2]
    for row in range(x.shape[0]):
        for expert, weight in sorted(zip(experts[row].tolist(), chosen[row], strict=True)):
            if not w.first_expert <= expert < w.first_expert + w.down.shape[0]:
                continue
            gate_up = linear(x[row:row + 1], w.gate_up[expert - w.first_expert])
            hidden = silu(gate_up[:, :inner]) * gate_up[:, inner:]
            routed[row] += (linear(hidden, w.down[expert - w.first_expert]) * weight)[0]
    return routed


@pytest.mark.parametrize("held", ["all", "upper half"])  # upper half: expert parallel's second rank
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inner", [32, 40])  # rows of whole AVX-512 vectors of floats, and with a tail of 8
@pytest.mark.parametrize("count", [1, 6, 40])
def test_the_cpu_paths_experts_taken_together_are_the_products_a_pair_at_a_time(
        count: int, inner: int, dtype: torch.dtype, held: str) -> None:
    w, x = weights(48, dtype, inner=inner), rows(count, dtype)
    if held == "upper half":
        half = EXPERTS // 2
        w = attrs.evolve(w, gate_up=w.gate_up[half:], down=w.down[half:], first_expert=half)
    experts, chosen = router.reference(linear(x, w.router)[:, :EXPERTS], TOP_K, True, dtype)
    assert len(set(experts.flatten().tolist())) > 1  # several experts, each with its own rows
    want = pair_by_pair(w, x, experts, chosen)
    assert torch.equal(routed_reference(w, x, experts, chosen), want)
    took = ((experts >= w.first_expert) & (experts < w.first_expert + w.down.shape[0])).any(dim=1)
    assert torch.equal(want.abs().sum(dim=1) > 0, took)  # a row that took no expert held adds nothing
    assert torch.equal(moe(w, x)[count // 2:count // 2 + 1], moe(w, x[count // 2:count // 2 + 1]))


def test_the_cpu_paths_fp8_experts_taken_together_are_the_products_a_pair_at_a_time() -> None:
    w, x = fp8_weights(48, torch.float32), rows(40, torch.float32)
    experts, chosen = router.reference(linear(x, w.router)[:, :EXPERTS], TOP_K, True, torch.float32)
    assert torch.equal(routed_reference(w, x, experts, chosen), pair_by_pair(w, x, experts, chosen))

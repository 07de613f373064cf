"""Feed-forward blocks: dense SwiGLU, and the sparse MoE with its shared expert (model.md 2.6).

The router runs its softmax in fp32; each row's routed experts are summed in ascending expert
order, each product's rows independent of one another (``linear``), so a row's output never
depends on which other rows chose the expert.
On CUDA the block is ``grouped_moe``, the grouped kernels of ``tfd_kernels.moe`` from the block's input
(at one row the router's product in the experts' launch): they run the routed experts in the same order,
each weighted term rounded to the model dtype and their sum in fp32 rather than in the model dtype, each
expert's SwiGLU middle rounded once rather than after each step, and the shared expert as one more expert
of every row in the same launches (no products of its own).
"""

from __future__ import annotations

import attrs
import torch

from tfd.model.fp8 import Experts, Fp8Experts, Fp8Weight, Weight
from tfd.model.ops import (
    Fp8Rows,
    Input,
    add_zrms,
    linear,
    sigmoid_gate,
    silu,
    swiglu_into,
    swiglu_product,
    values_of,
)
from tfd_kernels import moe as kernels_moe
from tfd_kernels import router
from tfd_kernels import swiglu as swiglu_kernel


@attrs.frozen
class DenseMlp:
    gate_up: Weight  # [2 * inner, hidden]: gate rows, then up rows (one product for both)
    down: Weight  # [hidden, inner]
    paired: bool = False  # gate_up's rows in tfd_kernels.swiglu.pair_rows blocks instead (CUDA)


def paired(w: DenseMlp) -> DenseMlp:
    """``w`` with its gate|up rows paired for the product that forms SwiGLU's middle itself, on
    CUDA where inner allows; else ``w``."""
    if not isinstance(w.gate_up, torch.Tensor) or not w.gate_up.is_cuda or w.paired \
            or w.gate_up.shape[0] % (2 * swiglu_kernel.PAIR):
        return w
    return DenseMlp(swiglu_kernel.pair_rows(w.gate_up), w.down, paired=True)


@attrs.frozen
class MoeWeights:
    router: Weight  # [experts + 1, hidden]: the router's rows, then the shared expert's gate row
    gate_up: Experts  # [experts, 2 * inner, hidden]: gate rows, then up rows
    down: Experts  # [experts, hidden, inner]
    shared: DenseMlp = attrs.field()  # gate rows, then up rows (never paired): tfd_kernels.moe reads them so
    top_k: int
    norm_top_k: bool
    first_expert: int = 0  # expert parallel: the routed experts held start here (the rest: elsewhere)

    @shared.validator
    def _unpaired(self, _: attrs.Attribute[DenseMlp], shared: DenseMlp) -> None:
        if shared.paired:
            raise ValueError("shared must keep gate rows then up rows, as tfd_kernels.moe reads them, "
                             "not paired")


def dense(w: DenseMlp, x: Input) -> torch.Tensor:
    """The MLP of rows ``x`` (with their FP8 form, ``Fp8Rows``, for an FP8 gate|up); SwiGLU's middle made
    with its FP8 form where the down product is FP8."""
    if w.paired:
        assert isinstance(w.gate_up, torch.Tensor), "paired rows are a tensor's (mlp.paired)"
        return linear(swiglu_product(values_of(x), w.gate_up), w.down)
    return linear(swiglu_into(linear(x, w.gate_up), w.down), w.down)


def moe(w: MoeWeights, x: torch.Tensor) -> torch.Tensor:
    """Each row's ``top_k`` experts (softmax in fp32, renormalised when ``norm_top_k``; among equal
    probabilities the lower expert wins) summed in ascending id, plus the gated shared expert. The
    router and the shared gate are one product; on CUDA the whole block is ``grouped_moe`` (every chosen
    expert and the shared one read once; at one row the router's product in the experts' launch). Under
    expert parallel only the experts held (``first_expert`` on) are added: the others are other ranks'."""
    if x.is_cuda:
        return grouped_moe(w, x)
    logits = linear(x, w.router)
    count = logits.shape[1] - 1
    choice, gate, shared = logits[:, :count], logits[:, count:], dense(w.shared, x)
    experts, weights = router.reference(choice, w.top_k, w.norm_top_k, x.dtype)
    return sigmoid_gate(shared, gate, routed_reference(w, x, experts, weights))


def routed_reference(w: MoeWeights, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor
                     ) -> torch.Tensor:
    """The routed experts' sum for rows ``x`` that chose ``experts`` [rows, top_k] with ``weights``, in
    the model dtype: expert by expert in ascending id, each expert's rows in one product whose rows are
    independent of one another (``linear``), so each row's sum takes its experts in ascending id and the
    same bits whatever its batch.
    Under expert parallel the experts not held are skipped: another rank adds them."""
    inner, held = w.down.shape[2], range(w.first_expert, w.first_expert + w.down.shape[0])
    routed = torch.zeros_like(x)
    for expert in torch.unique(experts).tolist():  # ascending
        if expert not in held:
            continue
        rows, slot = (experts == expert).nonzero(as_tuple=True)
        gate_up = linear(x[rows], w.gate_up[expert - w.first_expert])
        hidden = silu(gate_up[:, :inner]) * gate_up[:, inner:]
        made = linear(hidden, w.down[expert - w.first_expert]) * weights[rows, slot, None]
        routed.index_add_(0, rows, made)  # one addition an element: the rows are distinct
    return routed


def moe_add_zrms(w: MoeWeights, x: Input, residual: torch.Tensor, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``add_zrms(residual, moe(w, x), weight, eps)``, the same bits; on CUDA the addition and the
    norm run in the grouped kernels' last launch (decode: one launch fewer a layer), and at one row
    the router's product, the choice and both expert products in one launch. ``x`` may come with its
    FP8 form (``Fp8Rows``), which FP8 experts read instead of quantizing it."""
    values = values_of(x)
    if not values.is_cuda:
        return add_zrms(residual, moe(w, values), weight, eps)
    router, gate_up, down, shared = _tensors(w)
    rows = (x.q, x.scales) if isinstance(x, Fp8Rows) else None
    return kernels_moe.block_add_zrms(values, router, gate_up, down, w.top_k, w.norm_top_k, shared,
                                      kernels_moe.Residual(residual, weight, eps), rows)


def grouped_moe(w: MoeWeights, x: torch.Tensor) -> torch.Tensor:
    """The block from its input by ``tfd_kernels.moe.block``: the router's product (at one row in the
    experts' one launch), the choice and the grouping, the routed experts with the shared expert beside
    them, and the gated sum; CUDA's path (any device the kernels run on, the interpreter's CPU in
    tests). ValueError for experts split over ranks (expert parallel: the reference path's) and for
    weights the kernels cannot take (``_tensors``); scratch and other errors: ``tfd_kernels.moe``'s."""
    router_weight, gate_up, down, shared = _tensors(w)
    if w.down.shape[0] != router_weight.shape[0] - 1:
        raise ValueError("experts held by several ranks (expert parallel) run on the reference path only")
    return kernels_moe.block(x, router_weight, gate_up, down, w.top_k, w.norm_top_k, shared)


def _tensors(w: MoeWeights) -> tuple[torch.Tensor, kernels_moe.Weights, kernels_moe.Weights,
                                     tuple[kernels_moe.Weights, kernels_moe.Weights]]:
    """The router, the experts and the shared expert as the grouped kernels read them: float tensors,
    or FP8 ones with their scales (``Fp8Stack``). ValueError for what they cannot take: an FP8 router
    (Qwen's releases keep it in bf16), a shared expert whose gate and up stay apart (rows not in
    whole 128-row blocks: ``tfd.model.fp8.join``)."""
    if not isinstance(w.router, torch.Tensor):
        raise ValueError("the MoE kernels take a float router weight, and this block's is FP8")
    shared = (_operand(w.shared.gate_up), _operand(w.shared.down))
    return w.router, _operand(w.gate_up), _operand(w.down), shared


def _operand(weight: Weight | Experts) -> kernels_moe.Weights:
    """``weight`` as the MoE kernels take it."""
    if isinstance(weight, torch.Tensor):
        return weight
    if isinstance(weight, (Fp8Weight, Fp8Experts)):
        return kernels_moe.Fp8Stack(weight.data, weight.scale_inv)
    raise ValueError(f"the MoE kernels take one float or FP8 weight a product, not {type(weight).__name__} "
                     f"(a shared expert's gate and up rows in FP8 blocks of their own)")

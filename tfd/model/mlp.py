"""Feed-forward blocks: dense SwiGLU, and the sparse MoE with its shared expert (model.md 2.6).

The router runs its softmax in fp32; each row's routed experts are summed in ascending expert
order, one row at a time, so a row's output never depends on which other rows chose the expert.
On CUDA the routed experts run as one grouped kernel (``kernels.moe``) with the same order, its sum
in fp32 rather than the model dtype.
"""

from __future__ import annotations

import attrs
import torch

from kernels import moe as kernels_moe
from kernels import router
from kernels import swiglu as swiglu_kernel
from tfd.model.ops import linear, sigmoid_gate, silu, swiglu, swiglu_product


@attrs.frozen
class DenseMlp:
    gate_up: torch.Tensor  # [2 * inner, hidden]: gate rows, then up rows (one product for both)
    down: torch.Tensor  # [hidden, inner]
    paired: bool = False  # gate_up's rows in kernels.swiglu.pair_rows blocks instead (CUDA)


def paired(w: DenseMlp) -> DenseMlp:
    """``w`` with its gate|up rows paired for the product that forms SwiGLU's middle itself, on
    CUDA where inner allows; else ``w``."""
    if not w.gate_up.is_cuda or w.paired or w.gate_up.shape[0] % (2 * swiglu_kernel.PAIR):
        return w
    return DenseMlp(swiglu_kernel.pair_rows(w.gate_up), w.down, paired=True)


@attrs.frozen
class MoeWeights:
    router: torch.Tensor  # [experts + 1, hidden]: the router's rows, then the shared expert's gate row
    gate_up: torch.Tensor  # [experts, 2 * inner, hidden]: gate rows, then up rows
    down: torch.Tensor  # [experts, hidden, inner]
    shared: DenseMlp
    top_k: int
    norm_top_k: bool


def dense(w: DenseMlp, x: torch.Tensor) -> torch.Tensor:
    if w.paired:
        return linear(swiglu_product(x, w.gate_up), w.down)
    return linear(swiglu(linear(x, w.gate_up)), w.down)


def moe(w: MoeWeights, x: torch.Tensor) -> torch.Tensor:
    """Each row's ``top_k`` experts (softmax in fp32, renormalised when ``norm_top_k``; among equal
    probabilities the lower expert wins) summed in ascending id, plus the gated shared expert. The
    router and the shared gate are one product; on CUDA the choice, the grouping, the experts and
    the shared expert's addition are ``kernels.moe.routed``."""
    logits = linear(x, w.router)
    count = logits.shape[1] - 1
    choice, gate, shared = logits[:, :count], logits[:, count:], dense(w.shared, x)
    if x.is_cuda:  # every selected expert in one grouped kernel, each read once; the shared expert added last
        return kernels_moe.routed(x, w.gate_up, w.down, choice, w.top_k, w.norm_top_k, shared, gate)
    experts, weights = router.reference(choice, w.top_k, w.norm_top_k, x.dtype)
    inner = w.down.shape[2]
    routed = torch.zeros_like(x)
    for row in range(x.shape[0]):
        ranked = sorted(zip(experts[row].tolist(), weights[row], strict=True))
        for expert, weight in ranked:
            gate_up = linear(x[row:row + 1], w.gate_up[expert])
            hidden = silu(gate_up[:, :inner]) * gate_up[:, inner:]
            routed[row] += (linear(hidden, w.down[expert]) * weight)[0]
    return sigmoid_gate(shared, gate, routed)

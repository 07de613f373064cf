"""An MoE block at decode from its input (``kernels.moe``'s grouped experts): the router's product,
the block added to the residual stream and normalised for the next block, and optionally the add and
norm before it too.

``block_add_zrms`` takes the block's input (normalised); at one row the router's product runs inside
the experts' one launch (``kernels.moe_one``). ``add_block_add_zrms`` takes the stream and the mixer's
output before their add and norm; at one row with ``ADD_IN_LAUNCH`` that add and norm run inside the
same launch, each program that reads the input forming it itself (``kernels.moe_route.row_input``),
else an ``add_zrms`` launch comes first. Every form gives the bits of the launches one after another.
"""

from __future__ import annotations

import torch

from kernels import moe, moe_one, moe_plan, norm
from kernels.moe import Residual, Shared

# One row through ``add_block_add_zrms``: the add and norm before the block formed by the launch's reading
# programs (kernels.moe_one's ``added``); off, an ``add_zrms`` launch before (same bits). Not yet measured.
ADD_IN_LAUNCH = False


def block_add_zrms(x: torch.Tensor, router_weight: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                   top_k: int, normalise: bool, shared: tuple[torch.Tensor, torch.Tensor] | None,
                   residual: Residual, added: tuple[torch.Tensor, torch.Tensor, float] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``kernels.moe.routed_add_zrms`` from the block's input: the router's product
    ``kernels.gemm.matmul(x, router_weight)`` first (``router_weight`` [experts, hidden], with a shared
    expert one row more for its gate, last), and the shared expert's (gate_up, down); the same bits. At
    one row the router's product runs in the experts' one launch (``kernels.moe_one``), which may take
    its input before the add and norm (``added``, from ``add_block_add_zrms``). ValueError for a router
    weight of the wrong shape or dtype."""
    rows, hidden = x.shape
    experts = down.shape[0]
    if router_weight.shape != (experts + (shared is not None), hidden) or router_weight.dtype != x.dtype:
        raise ValueError(f"router_weight is {list(router_weight.shape)} {router_weight.dtype}, expected "
                         f"[{experts + (shared is not None)}, {hidden}] {x.dtype}")
    logits = torch.empty(rows, router_weight.shape[0], dtype=x.dtype, device=x.device)
    whole = None if shared is None else Shared(shared[0], shared[1], logits[:, experts:])
    total, normed = moe.routed_with(x, gate_up, down, logits[:, :experts], top_k, normalise, whole, residual,
                                    (router_weight, logits), added)
    assert normed is not None
    return total, normed


def add_block_add_zrms(x: torch.Tensor, delta: torch.Tensor, before: tuple[torch.Tensor, float],
                       router_weight: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, top_k: int,
                       normalise: bool, shared: tuple[torch.Tensor, torch.Tensor] | None,
                       weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``block_add_zrms`` of the norm of ``kernels.norm.add_zrms(x, delta, *before)`` (``before``: that
    norm's weight and eps), added to its sum, then the next norm (``weight``, ``eps``); the same bits.
    At one row with ``ADD_IN_LAUNCH`` the first add and norm take no launch of their own."""
    rows, hidden = x.shape
    if (ADD_IN_LAUNCH and moe.router_in_launch(rows, hidden, top_k + (shared is not None), router_weight)
            and moe_one.spreads(x.dtype, hidden, moe.DOWN_N, True) and delta.shape == x.shape
            and delta.dtype == x.dtype and top_k <= moe_plan.CHOICE_PAIRS):
        x = x.contiguous()
        return block_add_zrms(x, router_weight, gate_up, down, top_k, normalise, shared,
                              Residual(x, weight, eps), (delta.contiguous(), *before))
    total, normed = norm.add_zrms(x, delta, *before)
    return block_add_zrms(normed, router_weight, gate_up, down, top_k, normalise, shared,
                          Residual(total, weight, eps))

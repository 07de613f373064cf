"""The MoE launchers' arguments (``tfd_kernels.moe``): the shared expert and the residual stream a
block's output joins, and the checks of every tensor a launch takes. A wrong shape, dtype, layout or
device raises ValueError naming the argument, before any launch."""

from __future__ import annotations

from typing import NamedTuple

import torch

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class Residual(NamedTuple):
    """The residual stream an MoE block's output is added to, and the next norm's weight and eps."""

    x: torch.Tensor  # [rows, hidden] in the model dtype
    weight: torch.Tensor  # [hidden]: the zero-centred norm's
    eps: float


class Shared(NamedTuple):
    """An MoE layer's shared expert, which every row runs beside its routed ones, and its gate."""

    gate_up: torch.Tensor  # [2 * inner, hidden]: gate rows, then up rows
    down: torch.Tensor  # [hidden, inner]
    gate: torch.Tensor  # [rows, 1], any row stride (a column of the router's product): scales by sigmoid


def check(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, ids: torch.Tensor,
           weights: torch.Tensor, shared: Shared | None) -> None:
    if x.dim() != 2 or x.dtype not in DTYPES:
        raise ValueError(f"x must be [rows, hidden] in bf16, fp16 or fp32, not {list(x.shape)} {x.dtype}")
    rows, hidden = x.shape
    if down.dim() != 3 or down.shape[1] != hidden or down.dtype != x.dtype:
        raise ValueError(f"down must be [experts, {hidden}, inner] in {x.dtype}, not {list(down.shape)} "
                         f"{down.dtype}")
    experts, _, inner = down.shape
    if tuple(gate_up.shape) != (experts, 2 * inner, hidden) or gate_up.dtype != x.dtype:
        raise ValueError(f"gate_up must be [{experts}, {2 * inner}, {hidden}] in {x.dtype}, not "
                         f"{list(gate_up.shape)} {gate_up.dtype}")
    if gate_up.stride(2) != 1 or down.stride(2) != 1:
        raise ValueError("gate_up and down must be contiguous along their last axis")
    if ids.dim() != 2 or ids.shape[0] != rows or ids.shape[1] < 1 \
            or ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"ids must be [{rows}, top_k >= 1] int32 or int64, not {list(ids.shape)} "
                         f"{ids.dtype}")
    if weights.shape != ids.shape or not weights.is_floating_point():
        raise ValueError(f"weights must be {list(ids.shape)} floating point, not {list(weights.shape)} "
                         f"{weights.dtype}")
    named = [("gate_up", gate_up), ("down", down), ("ids", ids), ("weights", weights)]
    if shared is not None:
        check_shared(x, shared)
        named += [(f"shared.{part}", getattr(shared, part)) for part in Shared._fields]
    for name, tensor in named:
        if tensor.device != x.device:
            raise ValueError(f"{name} is on {tensor.device}, x on {x.device}")


def check_shared(x: torch.Tensor, shared: Shared) -> None:
    rows, hidden = x.shape
    down, gate_up, gate = shared.down, shared.gate_up, shared.gate
    if down.dim() != 2 or down.shape[0] != hidden or down.dtype != x.dtype or down.stride(1) != 1:
        raise ValueError(f"shared.down must be [{hidden}, inner] in {x.dtype}, contiguous along its last "
                         f"axis, not {list(down.shape)} {down.dtype} (strides {down.stride()})")
    inner = down.shape[1]
    if tuple(gate_up.shape) != (2 * inner, hidden) or gate_up.dtype != x.dtype or gate_up.stride(1) != 1:
        raise ValueError(f"shared.gate_up must be [{2 * inner}, {hidden}] in {x.dtype}, contiguous along its "
                         f"last axis, not {list(gate_up.shape)} {gate_up.dtype} (strides {gate_up.stride()})")
    if tuple(gate.shape) != (rows, 1) or not gate.is_floating_point():
        raise ValueError(f"shared.gate must be [{rows}, 1] floating point, not {list(gate.shape)} "
                         f"{gate.dtype}")


def check_residual(x: torch.Tensor, residual: Residual) -> None:
    if residual.x.shape != x.shape or residual.x.dtype != x.dtype or residual.x.device != x.device:
        raise ValueError(f"residual.x must be {list(x.shape)} {x.dtype} on {x.device}, not "
                         f"{list(residual.x.shape)} {residual.x.dtype} on {residual.x.device}")
    if tuple(residual.weight.shape) != (x.shape[1],) or residual.weight.device != x.device:
        raise ValueError(f"residual.weight must be [{x.shape[1]}] on {x.device}, not "
                         f"{list(residual.weight.shape)} on {residual.weight.device}")

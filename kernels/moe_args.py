"""The MoE launchers' arguments (``tfd_kernels.moe``): the experts' weights (float tensors, or block-wise
FP8 as ``Fp8Stack``), the shared expert and the residual stream a block's output joins, and the checks
of every tensor a launch takes. A wrong shape, dtype, layout, scale grid or device raises ValueError
naming the argument (``down``, ``shared.gate_up.scale_inv``, ...), before any launch."""

from __future__ import annotations

from typing import NamedTuple

import attrs
import torch
import triton

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FP8 = torch.float8_e4m3fn
SCALE_BLOCK = 128  # rows and columns a block-wise FP8 scale covers (Qwen's weight_block_size)


@attrs.frozen
class Fp8Stack:
    """Experts' weights (or the shared expert's) in block-wise FP8, ``tfd.model.fp8``'s format: ``data``
    float8_e4m3fn [experts, out, in] (the shared expert's [out, in]), contiguous along ``in``;
    ``scale_inv`` float32 [experts, ceil(out/128), ceil(in/128)] ([ceil(out/128), ceil(in/128)]): the
    real weight is data * scale_inv[o // 128, i // 128]. A fused gate_up's blocks count its rows
    gate then up, as stored (a block may hold both where inner is not a multiple of 128)."""

    data: torch.Tensor
    scale_inv: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        """The real weight's shape: data's."""
        return self.data.shape


Weights = torch.Tensor | Fp8Stack  # an MoE launcher's expert weights, float (the model dtype) or FP8


class Operand(NamedTuple):
    """A weight as a launch passes it: the tensor its matrix is read from, its scales (the matrix
    itself where float: never read) and whether it is FP8."""

    data: torch.Tensor
    scales: torch.Tensor
    fp8: bool

    def first(self) -> Operand:
        """Expert 0's operand (the stand-in for an absent shared expert: never read, of one kind)."""
        return Operand(self.data[0], self.scales[0], self.fp8)


def operand(weights: Weights) -> Operand:
    """``weights`` for a launch: FP8 scales contiguous, as the kernels index them by block (copied where
    given otherwise: scratch of their size)."""
    if isinstance(weights, Fp8Stack):
        return Operand(weights.data, weights.scale_inv.contiguous(), True)
    return Operand(weights, weights, False)


class Residual(NamedTuple):
    """The residual stream an MoE block's output is added to, and the next norm's weight and eps."""

    x: torch.Tensor  # [rows, hidden] in the model dtype
    weight: torch.Tensor  # [hidden]: the zero-centred norm's
    eps: float


class Shared(NamedTuple):
    """An MoE layer's shared expert, which every row runs beside its routed ones, and its gate."""

    gate_up: Weights  # [2 * inner, hidden]: gate rows, then up rows
    down: Weights  # [hidden, inner]
    gate: torch.Tensor  # [rows, 1], any row stride (a column of the router's product): scales by sigmoid


def check(x: torch.Tensor, gate_up: Weights, down: Weights, ids: torch.Tensor, weights: torch.Tensor,
          shared: Shared | None) -> None:
    if x.dim() != 2 or x.dtype not in DTYPES:
        raise ValueError(f"x must be [rows, hidden] in bf16, fp16 or fp32, not {list(x.shape)} {x.dtype}")
    rows, hidden = x.shape
    matrix = _matrix("down", down, x)
    if matrix.dim() != 3 or matrix.shape[1] != hidden:
        raise ValueError(f"{_label('down', down)} must be [experts, {hidden}, inner], not "
                         f"{list(matrix.shape)}")
    experts, _, inner = matrix.shape
    _check_weights("down", down, x, (experts, hidden, inner))
    _check_weights("gate_up", gate_up, x, (experts, 2 * inner, hidden))
    if ids.dim() != 2 or ids.shape[0] != rows or ids.shape[1] < 1 \
            or ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"ids must be [{rows}, top_k >= 1] int32 or int64, not {list(ids.shape)} "
                         f"{ids.dtype}")
    if weights.shape != ids.shape or not weights.is_floating_point():
        raise ValueError(f"weights must be {list(ids.shape)} floating point, not {list(weights.shape)} "
                         f"{weights.dtype}")
    named = [("ids", ids), ("weights", weights)]
    if shared is not None:
        check_shared(x, shared)
        named.append(("shared.gate", shared.gate))
    for name, tensor in named:
        if tensor.device != x.device:
            raise ValueError(f"{name} is on {tensor.device}, x on {x.device}")


def check_shared(x: torch.Tensor, shared: Shared) -> None:
    rows, hidden = x.shape
    down = _matrix("shared.down", shared.down, x)
    if down.dim() != 2 or down.shape[0] != hidden:
        raise ValueError(f"{_label('shared.down', shared.down)} must be [{hidden}, inner], not "
                         f"{list(down.shape)}")
    inner = down.shape[1]
    _check_weights("shared.down", shared.down, x, (hidden, inner))
    _check_weights("shared.gate_up", shared.gate_up, x, (2 * inner, hidden))
    gate = shared.gate
    if tuple(gate.shape) != (rows, 1) or not gate.is_floating_point():
        raise ValueError(f"shared.gate must be [{rows}, 1] floating point, not {list(gate.shape)} "
                         f"{gate.dtype}")


def _matrix(name: str, weights: object, x: torch.Tensor) -> torch.Tensor:
    """The tensor holding ``weights``' values (an Fp8Stack's data); ValueError naming it if neither."""
    if isinstance(weights, Fp8Stack):
        return weights.data
    if not isinstance(weights, torch.Tensor):
        raise ValueError(f"{name} must be a tensor in {x.dtype} or an Fp8Stack, not {type(weights).__name__}")
    return weights


def _label(name: str, weights: Weights) -> str:
    """How errors name ``weights``' values: ``name``, or an Fp8Stack's ``name.data``."""
    return f"{name}.data" if isinstance(weights, Fp8Stack) else name


def _check_weights(name: str, weights: Weights, x: torch.Tensor, shape: tuple[int, ...]) -> None:
    """``weights`` named ``name`` as the launch reads them: ``shape``, contiguous along the last axis,
    in x's dtype or (Fp8Stack) float8_e4m3fn with a float32 scale per 128x128 block; on x's device."""
    matrix = _matrix(name, weights, x)
    dtype = FP8 if isinstance(weights, Fp8Stack) else x.dtype
    label = _label(name, weights)
    if tuple(matrix.shape) != shape or matrix.dtype != dtype or matrix.stride(-1) != 1:
        raise ValueError(f"{label} must be {list(shape)} in {dtype}, contiguous along its last axis, not "
                         f"{list(matrix.shape)} {matrix.dtype} (strides {matrix.stride()})")
    if matrix.device != x.device:
        raise ValueError(f"{label} is on {matrix.device}, x on {x.device}")
    if isinstance(weights, Fp8Stack):
        scales = weights.scale_inv
        grid = (*shape[:-2], triton.cdiv(shape[-2], SCALE_BLOCK), triton.cdiv(shape[-1], SCALE_BLOCK))
        if tuple(scales.shape) != grid or scales.dtype != torch.float32:
            raise ValueError(f"{name}.scale_inv must be {list(grid)} in torch.float32 (one scale per "
                             f"{SCALE_BLOCK}x{SCALE_BLOCK} block of {list(shape)}), not {list(scales.shape)} "
                             f"{scales.dtype}")
        if scales.device != x.device:
            raise ValueError(f"{name}.scale_inv is on {scales.device}, x on {x.device}")


def check_residual(x: torch.Tensor, residual: Residual) -> None:
    if residual.x.shape != x.shape or residual.x.dtype != x.dtype or residual.x.device != x.device:
        raise ValueError(f"residual.x must be {list(x.shape)} {x.dtype} on {x.device}, not "
                         f"{list(residual.x.shape)} {residual.x.dtype} on {residual.x.device}")
    if tuple(residual.weight.shape) != (x.shape[1],) or residual.weight.device != x.device:
        raise ValueError(f"residual.weight must be [{x.shape[1]}] on {x.device}, not "
                         f"{list(residual.weight.shape)} on {residual.weight.device}")

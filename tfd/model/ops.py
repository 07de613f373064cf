"""Row-invariant primitives: each row of a result is computed the same way whatever the batch.

The contract (concurrent == solo, chunked == one pass) needs every token row to come out with the
same bits whether it is computed alone or beside others. CPU BLAS picks its kernel by the number
of rows (we measured products of one row differing from the same row inside a batch), so
``linear`` multiplies rows there in blocks of one size (``ROW_BLOCK``), padded with zero rows.
torch's CPU ``sigmoid``, ``silu`` and ``softplus`` give an element different bits depending on
where it falls in the tensor (vector body or scalar tail), so they are written out here from
``exp``, ``log1p`` and exact arithmetic, which we measured to be position-invariant, as are
reductions along the last axis. Model code takes these functions from here, never from torch
directly.

On CUDA the products and norms go to batch-invariant Triton kernels (``tfd_kernels.gemm``,
``tfd_kernels.norm``): cuBLAS and torch's reductions choose their split by the number of rows there.
Elementwise CUDA kernels apply the same function to every element, so the others stay torch's.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

from tfd.model import fp8
from tfd.model.fp8 import Experts, Fp8Experts, Fp8Weight, Joined, Rows, Weight
from tfd_kernels import fp8_gemm, fp8_rows, gemm, norm
from tfd_kernels import sigmoid_gate as sigmoid_gate_kernel
from tfd_kernels import swiglu as swiglu_kernel

# softplus(x) == x to float precision past this, as torch's own threshold.
SOFTPLUS_THRESHOLD = 20.0
# The CPU's products take rows in blocks of this many, the last padded with zero rows: every call of
# torch's product has the same shape, whose row results depend on neither the row's place in the block
# nor the rows beside it (checked on the torch in use: tests/model/test_ops.py); 4 rows cost a lone row
# what torch's one-row product did and a batch's rows a third to a sixth of it (2026-12-06, AVX-512).
ROW_BLOCK = 4
_NARROW = (torch.bfloat16, torch.float16)


@attrs.frozen
class Fp8Rows:
    """Rows made with their FP8 form beside them by the kernel that made them (``tfd_kernels.fp8_rows``,
    CUDA): what a block-wise FP8 product reads, quantized once where they were written rather than in a
    launch of their own before each product (``fp8_gemm.quantize``'s bits either way)."""

    values: torch.Tensor  # [rows, width] in the model dtype
    q: torch.Tensor  # float8_e4m3fn [rows, width]
    scales: torch.Tensor  # float32 [rows, ceil(width / 128)]


Input = torch.Tensor | Fp8Rows  # what a product reads: rows, or rows with their FP8 form


def values_of(x: Input) -> torch.Tensor:
    """The rows themselves, in the model dtype."""
    return x.values if isinstance(x, Fp8Rows) else x


def reads_fp8(weight: Weight | Experts | None) -> bool:
    """Whether ``weight``'s product reads its rows quantized: a block-wise FP8 weight, picked rows of one,
    joined parts of which one is, or FP8 experts (an MoE block's gate|up)."""
    if isinstance(weight, Joined):
        return any(reads_fp8(part) for part in weight.parts)
    return isinstance(weight, (Fp8Weight, Rows, Fp8Experts))


def linear(x: Input, weight: Weight, early: bool = False) -> torch.Tensor:
    """``x @ weight.T`` for ``x`` of shape [rows, in]; a row's bits never depend on the rows beside it
    (CUDA: ``tfd_kernels.gemm``'s fixed K split; the CPU: blocks of ``ROW_BLOCK`` rows). ``early``:
    ``tfd_kernels.gemm.matmul``'s (timing only). A block-wise FP8 weight by ``fp8.linear`` on the
    CPU, ``tfd_kernels.fp8_gemm`` on CUDA (the same math, its own order of additions; from ``Fp8Rows``
    without quantizing again); joined parts each alone; ``Rows`` of a stored weight by its product."""
    if isinstance(weight, Joined):
        return torch.cat([linear(x, part, early) for part in weight.parts], dim=-1)
    if isinstance(weight, Rows):  # the stored weight's product, its columns picked after (same bits a row)
        return linear(x, weight.weight)[:, weight.rows]
    if isinstance(weight, Fp8Weight):
        return fp8_linear(x, weight) if values_of(x).is_cuda else fp8.linear(values_of(x), weight)
    x = values_of(x)
    if x.is_cuda:
        return gemm.matmul(x, weight, early=early)
    rows = x.shape[0]
    if rows == 0:
        return F.linear(x, weight)
    pad = -rows % ROW_BLOCK
    padded = torch.cat([x, x.new_zeros(pad, x.shape[1])]) if pad else x.contiguous()
    return torch.cat([F.linear(block, weight) for block in torch.split(padded, ROW_BLOCK)])[:rows]


def fp8_linear(x: Input, weight: Fp8Weight, conv: gemm.Conv | None = None) -> torch.Tensor:
    """``linear`` of a block-wise FP8 weight on CUDA (``tfd_kernels.fp8_gemm``), from ``Fp8Rows`` without
    quantizing again; ``conv``: the GDN projection's conv over the first columns (``fp8_gemm.product``'s)."""
    if isinstance(x, Fp8Rows):
        made: torch.Tensor = fp8_gemm.product(x.q, x.scales, weight.data, weight.scale_inv, x.values.dtype,
                                              conv=conv)
        return made
    found: torch.Tensor = fp8_gemm.matmul(x, weight.data, weight.scale_inv, conv=conv)
    return found


def row_sums(x: torch.Tensor) -> torch.Tensor:
    """Sums along the last axis, in x's dtype; each the same whatever else is in ``x``. On CUDA the
    batch-invariant GEMM against a row of ones (fp32 accumulation), since torch's reduction there
    splits a sum by the number of sums; elsewhere torch's last-axis sum."""
    if x.is_cuda:
        ones = torch.ones(1, x.shape[-1], dtype=x.dtype, device=x.device)
        return gemm.matmul(x.reshape(-1, x.shape[-1]), ones).view(x.shape[:-1])
    return x.sum(dim=-1)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """1 / (1 + exp(-x)), the same at every position; computed in fp32 at least."""
    values = x.float() if x.dtype in _NARROW else x
    return (1.0 / (1.0 + torch.exp(-values))).to(x.dtype)


def sigmoid_gate(x: torch.Tensor, gate: torch.Tensor, base: torch.Tensor | None = None) -> torch.Tensor:
    """``base + x * sigmoid(gate)`` for ``x`` [rows, width], ``gate`` [rows, heads, width / heads]
    or [rows, 1]; each op rounds to the model dtype (one kernel on CUDA)."""
    if x.is_cuda:
        return sigmoid_gate_kernel.sigmoid_gate(x, gate, base)
    gated = x * sigmoid(gate.reshape(x.shape[0], -1))
    return gated if base is None else base + gated


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x), the same at every position; computed in fp32 at least."""
    values = x.float() if x.dtype in _NARROW else x
    return (values / (1.0 + torch.exp(-values))).to(x.dtype)


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up from ``h`` [rows, 2 * inner] = [gate | up]; silu rounded to h's dtype first."""
    if h.is_cuda:
        return swiglu_kernel.swiglu(h)
    inner = h.shape[-1] // 2
    return silu(h[..., :inner]) * h[..., inner:]


def swiglu_product(x: torch.Tensor, paired: torch.Tensor) -> torch.Tensor:
    """SwiGLU's middle of ``x``'s product with a gate|up weight laid out by
    ``tfd_kernels.swiglu.pair_rows`` (CUDA only): at few rows formed as the product's partial sums are
    added, one launch for both; the same bits as ``swiglu(linear(x, gate_up))``."""
    if not x.is_cuda:
        raise ValueError("a paired gate|up weight is built for CUDA only; the CPU keeps gate then up")
    return gemm.matmul(x, paired, swiglu=True)


def softplus(x: torch.Tensor) -> torch.Tensor:
    """log(1 + exp(x)), elementwise in the same way at every position."""
    tame = torch.log1p(torch.exp(torch.clamp(x, max=SOFTPLUS_THRESHOLD)))
    return torch.where(x > SOFTPLUS_THRESHOLD, x, tame)


def zrms(x: torch.Tensor, weight: torch.Tensor, eps: float, group: int | None = None) -> torch.Tensor:
    """Zero-centred RMSNorm: normalise in fp32, scale by ``1 + weight``, cast back.

    With ``group``, the last axis is cut into groups of that width, each normalised on its own
    (Flash Next's residual streams).
    """
    if x.is_cuda:
        return norm.zrms(x.reshape(-1, x.shape[-1]), weight, eps, group).view(x.shape)
    values = x.float()
    if group is not None:
        values = torch.unflatten(values, -1, (-1, group))
    values = values * torch.rsqrt(values.pow(2).mean(-1, keepdim=True) + eps)
    if group is not None:
        values = values.flatten(-2)
    return (values * (1.0 + weight.float())).to(x.dtype)


def add_zrms(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual ``x + delta`` and its zero-centred RMSNorm (one kernel on CUDA)."""
    if x.is_cuda:
        return norm.add_zrms(x, delta, weight, eps)
    total = x + delta
    return total, zrms(total, weight, eps)


def gated_rms(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
              activation: str) -> torch.Tensor:
    """The GDN output norm: plain RMSNorm of ``x`` (weight, not 1 + weight), times act(gate), per
    head of ``x`` [rows, heads, width]; the result in ``gate``'s dtype, ``x`` rounded to it first."""
    if x.is_cuda:
        return norm.gated_rms(x, gate, weight, eps, activation)
    x = x.to(gate.dtype)
    values = x.float()
    values = values * torch.rsqrt(values.pow(2).mean(-1, keepdim=True) + eps)
    values = weight * values.to(x.dtype)
    return (values * activate(gate.float(), activation)).to(x.dtype)


def activate(x: torch.Tensor, name: str) -> torch.Tensor:
    if name == "silu":
        return silu(x)
    if name == "sigmoid":
        return sigmoid(x)
    raise ValueError(f"unknown activation {name!r}")


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) along the last axis (eps inside the sum, as FLA)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def fp8_room(x: torch.Tensor, width: int, into: Weight | Experts | None, fits: bool
             ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Room for ``x``'s count of rows of ``width`` that the kernel making them writes quantized too
    (``Fp8Rows``): on CUDA, where the product ``into`` that reads them next is FP8's and the kernel's
    programs hold whole groups (``fits``); else None."""
    if not (x.is_cuda and fits and reads_fp8(into)):
        return None
    room: tuple[torch.Tensor, torch.Tensor] = fp8_rows.empty_rows(x.shape[0], width, x.device)
    return room


def zrms_into(x: torch.Tensor, weight: torch.Tensor, eps: float, into: Weight | Experts | None) -> Input:
    """``zrms`` of ``x`` [rows, width] for the product ``into``: with the rows' FP8 form where that
    product reads it (``Fp8Rows``), else the rows."""
    room = fp8_room(x, x.shape[-1], into, norm.quantizes(x.shape[-1]))
    if room is None:
        return zrms(x, weight, eps)
    return Fp8Rows(norm.zrms(x, weight, eps, rows=room), *room)


def add_zrms_into(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                  into: Weight | Experts | None) -> tuple[torch.Tensor, Input]:
    """``add_zrms`` with the norm's rows for the product ``into`` (as ``zrms_into``'s)."""
    room = fp8_room(x, x.shape[-1], into, norm.quantizes(x.shape[-1]))
    if room is None:
        return add_zrms(x, delta, weight, eps)
    total, out = norm.add_zrms(x, delta, weight, eps, rows=room)
    return total, Fp8Rows(out, *room)


def gated_rms_into(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, activation: str,
                   into: Weight | None) -> Input:
    """``gated_rms`` of ``x`` [rows, heads, width] as rows [rows, heads * width] for the product ``into``
    (as ``zrms_into``'s)."""
    count, heads, width = x.shape
    room = fp8_room(gate, heads * width, into, norm.gated_quantizes(width))
    if room is None:
        return gated_rms(x, gate, weight, eps, activation).reshape(count, -1)
    return Fp8Rows(norm.gated_rms(x, gate, weight, eps, activation, rows=room).reshape(count, -1), *room)


def swiglu_into(h: torch.Tensor, into: Weight | None) -> Input:
    """``swiglu`` of ``h`` [rows, 2 * inner] for the product ``into`` (as ``zrms_into``'s)."""
    room = fp8_room(h, h.shape[-1] // 2, into, True)
    if room is None:
        return swiglu(h)
    return Fp8Rows(swiglu_kernel.swiglu(h, rows=room), *room)

"""``base + x * sigmoid(gate)`` in one pass: attention's output gate and the MoE shared expert's.

``x`` [rows, width] is scaled by ``sigmoid(gate)``, where ``gate`` is [rows, heads, width / heads]
(attention: a gate per element, each head's gate a slice of the query projection, read in place)
or [rows, 1] (the shared expert: one gate a row); ``base`` [rows, width], when given, is added
after. The cast points follow ``tfd.model``: sigmoid in fp32 rounded to the model
dtype, the product rounded, then the sum rounded, as the torch ops there do. Each row's inputs may
sit at any row stride (slices of a fused projection); the result is a new contiguous tensor.
Elementwise, so a row's bits never depend on the others.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import pdl

BLOCK = 1024


@triton.jit
def gated(value, g, dtype: tl.constexpr):
    """value * sigmoid(g) in ``dtype``: sigmoid in fp32 rounded to dtype, then the product rounded
    (shared with the MoE kernel's last step, which adds the shared expert this way)."""
    sig = (1.0 / (1.0 + tl.exp(-g.to(tl.float32)))).to(dtype).to(tl.float32)
    return (value.to(tl.float32) * sig).to(dtype)


@triton.jit
def widened(x):
    """``x`` in fp32, exactly; a bf16 ``x`` through its bits. From a plain cast the compiler narrows the
    sum ``x`` feeds to a bf16 add and contracts it with the product that made ``x`` into one fma, so
    the product is never rounded (a third of a hyper write's elements differed from torch's on the
    H200); the bits leave it nothing to contract."""
    if x.dtype.is_bf16():
        wide = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        wide = x.to(tl.float32)
    return wide


@triton.jit
def _sigmoid_gate(x, gate, base, out, width, stride_x, stride_g, stride_b, head_width, stride_head, gate_col,
                  HAS_BASE: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    at = (cols // head_width) * stride_head + (cols % head_width) * gate_col  # gate_col 0: one a row
    g = tl.load(gate + row * stride_g + at, mask=mask, other=0.0)
    result = gated(tl.load(x + row * stride_x + cols, mask=mask, other=0.0), g, out.dtype.element_ty)
    if HAS_BASE:
        result = (tl.load(base + row * stride_b + cols, mask=mask, other=0.0).to(tl.float32) +
                  widened(result)).to(out.dtype.element_ty)
    tl.store(out + row * width + cols, result, mask=mask)


def sigmoid_gate(x: torch.Tensor, gate: torch.Tensor, base: torch.Tensor | None = None) -> torch.Tensor:
    """``base + x * sigmoid(gate)`` (``base`` optional) for ``x`` [rows, width] and ``gate`` [rows,
    heads, width / heads] or [rows, 1], each with unit column stride; in x's dtype."""
    per_head = gate.dim() == 3 and gate.shape[1] * gate.shape[2] == x.shape[-1]
    if x.dim() != 2 or gate.shape[0] != x.shape[0] or not (per_head or tuple(gate.shape[1:]) == (1,)):
        raise ValueError(f"x {list(x.shape)} and gate {list(gate.shape)}: want [rows, width] and "
                         "[rows, heads, width / heads] or [rows, 1]")
    if base is not None and base.shape != x.shape:
        raise ValueError(f"base {list(base.shape)} must match x {list(x.shape)}")
    x = x if x.stride(1) == 1 else x.contiguous()
    if base is not None and base.stride(1) != 1:
        base = base.contiguous()
    rows, width = x.shape
    if gate.dim() == 3:
        gate = gate if gate.stride(2) == 1 else gate.contiguous()
        head_width, stride_head, gate_col = gate.shape[2], gate.stride(1), 1
    else:
        head_width, stride_head, gate_col = width, 0, 0
    out = torch.empty(rows, width, dtype=x.dtype, device=x.device)
    if rows:
        _sigmoid_gate[(rows, triton.cdiv(width, BLOCK))](
            x, gate, x if base is None else base, out, width, x.stride(0), gate.stride(0),
            0 if base is None else base.stride(0), head_width, stride_head, gate_col,
            HAS_BASE=base is not None, BLOCK=BLOCK, **pdl.options(x.device))
    return out

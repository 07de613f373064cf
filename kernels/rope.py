"""A head's zero-centred RMSNorm and then partial rotate-half RoPE, in one pass (attention's q, k).

``x`` [rows, heads, head_dim] may be a strided view (the query half of q|gate); ``cos``/``sin``
[rows, rotary] hold each row's angles in the model dtype, rotary <= head_dim even. Lanes past
``rotary`` pass through normalised. The cast points follow ``tfd.model.ops.zrms`` and
``tfd.model.rope.Rotary.apply``: the norm rounds to the model dtype, each rotated product rounds,
then their sum. One program per (row, head): nothing depends on the other rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import pdl


@triton.jit
def _norm_rope(x, weight, cos, sin, out, head_dim, rotary, stride_xr, stride_xh, stride_c, heads, eps,
               BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    row, head = tl.program_id(0), tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    live = cols < head_dim
    base = x + row * stride_xr + head * stride_xh
    values = tl.load(base + cols, mask=live, other=0.0).to(tl.float32)
    scale = tl.rsqrt(tl.sum(values * values, axis=0) / head_dim + eps)
    normed = (values * scale * (1.0 + tl.load(weight + cols, mask=live, other=0.0).to(tl.float32)))
    normed = normed.to(out.dtype.element_ty).to(tl.float32)
    half = rotary // 2
    turned = rotary > cols
    partner = tl.where(cols < half, cols + half, cols - half)
    other = tl.load(base + partner, mask=live & turned, other=0.0).to(tl.float32)
    other = (other * scale * (1.0 + tl.load(weight + partner, mask=live & turned, other=0.0).to(tl.float32)))
    other = other.to(out.dtype.element_ty).to(tl.float32)
    other = tl.where(cols < half, -other, other)
    c = tl.load(cos + row * stride_c + cols, mask=live & turned, other=1.0).to(tl.float32)
    s = tl.load(sin + row * stride_c + cols, mask=live & turned, other=0.0).to(tl.float32)
    rotated = ((normed * c).to(out.dtype.element_ty).to(tl.float32) +
               (other * s).to(out.dtype.element_ty).to(tl.float32))
    result = tl.where(turned, rotated, normed)
    tl.store(out + (row * heads + head) * head_dim + cols, result.to(out.dtype.element_ty), mask=live)


def norm_rope(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float
              ) -> torch.Tensor:
    """RoPE(zrms(x)) per head for ``x`` [rows, heads, head_dim]; a new contiguous tensor."""
    if x.dim() != 3 or x.stride(2) != 1:
        raise ValueError(f"x must be [rows, heads, head_dim] with unit last stride, got {list(x.shape)}")
    rows, heads, head_dim = x.shape
    rotary = cos.shape[1]
    if weight.shape != (head_dim,) or cos.shape != (rows, rotary) or sin.shape != cos.shape or rotary % 2 \
            or rotary > head_dim or cos.stride(1) != 1 or sin.stride() != cos.stride():
        raise ValueError(f"weight {list(weight.shape)}, cos {list(cos.shape)} and sin {list(sin.shape)} "
                         f"do not fit x {list(x.shape)}")
    out = torch.empty(rows, heads, head_dim, dtype=x.dtype, device=x.device)
    if rows:
        _norm_rope[(rows, heads)](x, weight, cos, sin, out, head_dim, rotary, x.stride(0), x.stride(1),
                                  cos.stride(0), heads, eps, BLOCK=triton.next_power_of_2(head_dim),
                                  **pdl.options(x.device))
    return out

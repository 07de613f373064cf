"""SwiGLU's middle: ``silu(gate) * up`` from one product holding both, one program per row block.

``h`` [rows, 2 * inner] is the fused gate|up projection; the result [rows, inner] in h's dtype. The
cast points follow ``tfd.model.ops``: silu in fp32 rounded to the model dtype, then the product in
fp32 rounded again. Elementwise, so a row's bits never depend on the others.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import pdl

BLOCK = 1024


@triton.jit
def _swiglu(h, out, inner, stride_h, stride_o, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inner
    gate = tl.load(h + row * stride_h + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(h + row * stride_h + inner + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(out.dtype.element_ty).to(tl.float32)
    tl.store(out + row * stride_o + cols, (act * up).to(out.dtype.element_ty), mask=mask)


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """silu(h[:, :inner]) * h[:, inner:] for ``h`` [rows, 2 * inner], contiguous along columns."""
    if h.dim() != 2 or h.shape[1] % 2 or h.stride(1) != 1:
        raise ValueError(f"h must be [rows, 2 * inner] with unit column stride, got {list(h.shape)}")
    rows, inner = h.shape[0], h.shape[1] // 2
    out = torch.empty(rows, inner, dtype=h.dtype, device=h.device)
    if rows:
        _swiglu[(rows, triton.cdiv(inner, BLOCK))](h, out, inner, h.stride(0), out.stride(0), BLOCK=BLOCK,
                                                   **pdl.options(h.device))
    return out

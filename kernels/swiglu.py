"""SwiGLU's middle: ``silu(gate) * up`` from one product holding both, one program per row block.

``h`` [rows, 2 * inner] is the fused gate|up projection; the result [rows, inner] in h's dtype. The
cast points follow ``tfd.model.ops``: silu in fp32 rounded to the model dtype, then the product in
fp32 rounded again (``silu_mul``, which the paired product's epilogue in ``tfd_kernels.gemm`` shares).
Elementwise, so a row's bits never depend on the others. ``paired``: h's columns come in blocks of
``PAIR`` gate columns then the same ``PAIR`` up columns (``pair_rows`` lays a weight out so), as the
paired product writes them when it does not form the middle itself.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import fp8_rows, pdl
from tfd_kernels.runtime import INTERPRETED

BLOCK = 1024
PAIR = 32  # columns of a paired block: PAIR gate columns, then their PAIR up columns


@triton.jit
def silu_mul(gate, up, dtype: tl.constexpr):
    """silu(gate) * up in ``dtype`` from gate and up already in it (widened to fp32 here)."""
    gate, up = gate.to(tl.float32), up.to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    return (act * up).to(dtype)


@triton.jit
def _swiglu(h, out, q, scales, inner, stride_h, stride_o, stride_q, stride_s, BLOCK: tl.constexpr,
            PAIRED: tl.constexpr, PAIR: tl.constexpr, QUANTIZE: tl.constexpr, EXACT_CAST: tl.constexpr,
            PDL: tl.constexpr):
    pdl.wait(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inner
    if PAIRED:
        gate_cols = (cols // PAIR) * (2 * PAIR) + cols % PAIR
        up_cols = gate_cols + PAIR
    else:
        gate_cols = cols
        up_cols = inner + cols
    gate = tl.load(h + row * stride_h + gate_cols, mask=mask, other=0.0)
    up = tl.load(h + row * stride_h + up_cols, mask=mask, other=0.0)
    middle = silu_mul(gate, up, out.dtype.element_ty)
    tl.store(out + row * stride_o + cols, middle, mask=mask)
    if QUANTIZE:  # BLOCK columns from a multiple of BLOCK: whole 128-wide groups
        fp8_rows.store_groups(middle.to(tl.float32), mask, q, scales, row * stride_q + cols,
                              row * stride_s + tl.program_id(1) * (BLOCK // 128), BLOCK // 128, EXACT_CAST)


def swiglu(h: torch.Tensor, paired: bool = False, rows: tuple[torch.Tensor, torch.Tensor] | None = None
           ) -> torch.Tensor:
    """silu(h[:, :inner]) * h[:, inner:] for ``h`` [rows, 2 * inner], contiguous along columns; with
    ``paired``, gate and up alternate in blocks of ``PAIR`` columns instead. ``rows``
    (``fp8_rows.empty_rows`` of [rows, inner]): the result quantized there too, as
    ``fp8_gemm.quantize`` would."""
    if h.dim() != 2 or h.shape[1] % (2 * PAIR if paired else 2) or h.stride(1) != 1:
        want = f"a multiple of {2 * PAIR} " if paired else ""
        raise ValueError(f"h must be [rows, 2 * inner] with unit column stride and {want}columns, "
                         f"got {list(h.shape)}")
    count, inner = h.shape[0], h.shape[1] // 2
    out = torch.empty(count, inner, dtype=h.dtype, device=h.device)
    q, scales = fp8_rows.targets(rows, count, inner, out)
    if count:
        _swiglu[(count, triton.cdiv(inner, BLOCK))](
            h, out, q, scales, inner, h.stride(0), out.stride(0), q.stride(0), scales.stride(0), BLOCK=BLOCK,
            PAIRED=paired, PAIR=PAIR, QUANTIZE=rows is not None, EXACT_CAST=INTERPRETED,
            **pdl.options(h.device))
    return out


def pair_rows(gate_up: torch.Tensor) -> torch.Tensor:
    """A [2 * inner, k] gate|up weight with its rows in paired blocks (``PAIR`` gate rows, then the
    same ``PAIR`` up rows), so a product's output tile holds whole pairs; inner a multiple of
    ``PAIR``."""
    two_inner, k = gate_up.shape
    if two_inner % (2 * PAIR):
        raise ValueError(f"gate_up has {two_inner} rows; pairing needs a multiple of {2 * PAIR}")
    gate, up = gate_up.view(2, two_inner // (2 * PAIR), PAIR, k).unbind(0)
    return torch.stack((gate, up), dim=1).reshape(two_inner, k)

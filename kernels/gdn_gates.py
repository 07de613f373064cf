"""The GDN layer's per-head gates from its fused projection: beta = sigmoid(b) and the log decay
g = -exp(A_log) * softplus(a + dt_bias), one program per row.

``b`` and ``a`` are [rows, heads] views (any row stride) of the projection's output. The cast
points follow ``tfd.model.gdn``: sigmoid in fp32 rounded to the model dtype, then widened; g in
fp32 with softplus(x) = x past 20. Both results are fp32 [rows, heads]. Elementwise per row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import pdl

SOFTPLUS_THRESHOLD = 20.0


@triton.jit
def gate_values(raw_b, raw_a, a_log, dt_bias, threshold):
    """(beta, g) in fp32 from loaded b and a (model dtype) and their heads' A_log and dt_bias; the
    one arithmetic of this kernel and of the GDN decode kernel that forms its gates itself."""
    sig = (1.0 / (1.0 + tl.exp(-raw_b.to(tl.float32)))).to(raw_b.dtype).to(tl.float32)
    x = raw_a.to(tl.float32) + dt_bias.to(tl.float32)
    soft = tl.where(x > threshold, x, tl.log(1.0 + tl.exp(tl.minimum(x, threshold))))
    return sig, -tl.exp(a_log.to(tl.float32)) * soft


@triton.jit
def _gates(b, a, a_log, dt_bias, beta, g, heads, stride_b, stride_a, threshold, BLOCK: tl.constexpr,
           PDL: tl.constexpr):
    pdl.wait(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < heads
    sig, decay = gate_values(tl.load(b + row * stride_b + cols, mask=mask, other=0.0),
                             tl.load(a + row * stride_a + cols, mask=mask, other=0.0),
                             tl.load(a_log + cols, mask=mask, other=0.0),
                             tl.load(dt_bias + cols, mask=mask, other=0.0), threshold)
    tl.store(beta + row * heads + cols, sig, mask=mask)
    tl.store(g + row * heads + cols, decay, mask=mask)


def gates(b: torch.Tensor, a: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(beta, g), fp32 [rows, heads] each, from ``b`` and ``a`` [rows, heads] (unit column stride)."""
    if b.dim() != 2 or a.shape != b.shape or b.stride(1) != 1 or a.stride(1) != 1:
        raise ValueError(f"b {list(b.shape)} and a {list(a.shape)} must be [rows, heads] with unit "
                         "column stride")
    rows, heads = b.shape
    if a_log.shape != (heads,) or dt_bias.shape != (heads,):
        raise ValueError(f"a_log {list(a_log.shape)} and dt_bias {list(dt_bias.shape)} must be [{heads}]")
    beta = torch.empty(rows, heads, dtype=torch.float32, device=b.device)
    g = torch.empty_like(beta)
    if rows:
        _gates[(rows,)](b, a, a_log, dt_bias, beta, g, heads, b.stride(0), a.stride(0), SOFTPLUS_THRESHOLD,
                        BLOCK=triton.next_power_of_2(heads), **pdl.options(b.device))
    return beta, g

"""GDN's out projection reading its input as the gated norm of the rule's output (``kernels.gemm``'s
gated form, ``gemm.gated_matmul``): a K step is one head, whose norm and gate are formed as the step is
read, with the norm kernel's own arithmetic (``kernels.norm.gated_heads``, a pairwise sum), so the
product has the bits of the norm's launch then the plain product, without that launch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels import norm


@triton.jit
def segment_sum_gated(o, z, w, norm_weight, rows, cols, m, n, k, start, length, stride_om, stride_zm,
                      stride_wn, eps, dtype: tl.constexpr, ACTIVATION: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WIDEN: tl.constexpr):
    """``segment_sum`` over GDN's gated norm of ``o`` (fp32 rows of heads of ``BLOCK_K`` values) by
    the gate ``z``, formed a K step (one head) at a time as it is read (``kernels.norm.gated_heads``:
    the bits of the norm's kernel, so of that kernel then ``segment_sum``)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    weight = tl.load(norm_weight + tl.arange(0, BLOCK_K)).to(tl.float32)
    for offset in range(0, length, BLOCK_K):
        ks = start + offset + tl.arange(0, BLOCK_K)
        live = (rows[:, None] < m) & (ks[None, :] < k)
        # the reference rounds the layer's output to the model dtype before the norm
        values = tl.load(o + rows[:, None] * stride_om + ks[None, :], mask=live, other=0.0).to(dtype)
        g = tl.load(z + rows[:, None] * stride_zm + ks[None, :], mask=live, other=0.0).to(tl.float32)
        a = norm.gated_heads(values.to(tl.float32), g, weight, BLOCK_K, eps, dtype, ACTIVATION, BLOCK_K, True)
        b = tl.load(w + cols[:, None] * stride_wn + ks[None, :], mask=(cols[:, None] < n) & (ks[None, :] < k),
                    other=0.0)
        if WIDEN:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
    return acc

"""A head's zero-centred RMSNorm and then partial rotate-half RoPE, in one pass (attention's q, k).

``x`` [rows, heads, head_dim] may be a strided view (the query half of q|gate); ``cos``/``sin``
[rows, rotary] hold each row's angles in the model dtype, rotary <= head_dim even. Lanes past
``rotary`` pass through normalised. The cast points follow ``tfd.model.ops.zrms`` and
``tfd.model.rope.Rotary.apply``: the norm rounds to the model dtype, each rotated product rounds,
then their sum. One program per (row, head): nothing depends on the other rows. At decode
``norm_rope_store`` also stores k, and v beside it, into the caches as ``tfd_kernels.cache_write`` does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import cache_write, pdl
from tfd_kernels.sigmoid_gate import widened

# A head's reads besides its values (weights, rotation partners, angles) asked for before the norm's sum,
# after which each waited for it; the same bits.
# H200, 35B-A3B one stream, tfd bench --variant, best of three (2026-12-02): 2.4338 ms against 2.4381.
LOADS_FIRST = True


@triton.jit
def _norm_rope(x, weight, cos, sin, out, head_dim, rotary, stride_xr, stride_xh, stride_c, heads, eps,
               y, y_weight, y_out, stride_yr, stride_yh, y_heads, BLOCK: tl.constexpr,
               LOADS_FIRST: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    row, head = tl.program_id(0), tl.program_id(1)
    if head < heads:
        one(x, weight, cos, sin, out + (row * heads + head) * head_dim, head_dim, rotary, stride_xr,
            stride_xh, stride_c, eps, row, head, BLOCK, LOADS_FIRST)
    else:  # the second tensor's heads follow the first's in the grid
        one(y, y_weight, cos, sin, y_out + (row * y_heads + head - heads) * head_dim, head_dim, rotary,
            stride_yr, stride_yh, stride_c, eps, row, head - heads, BLOCK, LOADS_FIRST)


@triton.jit
def _norm_rope_store(x, weight, cos, sin, out, head_dim, rotary, stride_xr, stride_xh, stride_c, heads, eps,
                     y, y_weight, stride_yr, stride_yh, y_heads, v, stride_vr, stride_vh, k_cache, v_cache,
                     page_table, lengths, page_rows, stride_tl, stride_cp, stride_cr, stride_ch,
                     BLOCK: tl.constexpr, LOADS_FIRST: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    row, head = tl.program_id(0), tl.program_id(1)
    if head < heads:
        one(x, weight, cos, sin, out + (row * heads + head) * head_dim, head_dim, rotary, stride_xr,
            stride_xh, stride_c, eps, row, head, BLOCK, LOADS_FIRST)
    else:  # y's heads, then v's, each into its cache row at the lane's last position (none: padding)
        length = tl.load(lengths + row)
        if length > 0:
            at = cache_write.last_row(page_table, stride_tl, row, length, page_rows, stride_cp, stride_cr)
            kv = head - heads
            if kv < y_heads:
                one(y, y_weight, cos, sin, k_cache + at + kv * stride_ch, head_dim, rotary, stride_yr,
                    stride_yh, stride_c, eps, row, kv, BLOCK, LOADS_FIRST)
            else:
                kv -= y_heads
                dims = tl.arange(0, BLOCK)
                live = dims < head_dim
                value = tl.load(v + row * stride_vr + kv * stride_vh + dims, mask=live)
                tl.store(v_cache + at + kv * stride_ch + dims, value, mask=live)


@triton.jit
def _one_loads(weight, cos, sin, base, row, stride_c, cols, partner, live, turned):
    """What a (row, head) reads besides its values: the norm's weight at its lanes and their rotation
    partners, the partners' values, the row's angles."""
    w = tl.load(weight + cols, mask=live, other=0.0).to(tl.float32)
    other = tl.load(base + partner, mask=live & turned, other=0.0).to(tl.float32)
    w_other = tl.load(weight + partner, mask=live & turned, other=0.0).to(tl.float32)
    c = tl.load(cos + row * stride_c + cols, mask=live & turned, other=1.0).to(tl.float32)
    s = tl.load(sin + row * stride_c + cols, mask=live & turned, other=0.0).to(tl.float32)
    return w, other, w_other, c, s


@triton.jit
def one(x, weight, cos, sin, dest, head_dim, rotary, stride_xr, stride_xh, stride_c, eps, row, head,
        BLOCK: tl.constexpr, LOADS_FIRST: tl.constexpr):
    """One (row, head): the norm, then the rotation of its first ``rotary`` lanes, stored at ``dest``
    (also a pooled index key's, in ``tfd_kernels.index_pool``);
    with ``LOADS_FIRST`` every read asked for before the norm's sum (after it, each waits for it)."""
    cols = tl.arange(0, BLOCK)
    live = cols < head_dim
    base = x + row * stride_xr + head * stride_xh
    half = rotary // 2
    turned = rotary > cols
    partner = tl.where(cols < half, cols + half, cols - half)
    values = tl.load(base + cols, mask=live, other=0.0).to(tl.float32)
    if LOADS_FIRST:
        w, other, w_other, c, s = _one_loads(weight, cos, sin, base, row, stride_c, cols, partner, live,
                                             turned)
    scale = tl.rsqrt(tl.sum(values * values, axis=0) / head_dim + eps)
    if not LOADS_FIRST:
        w, other, w_other, c, s = _one_loads(weight, cos, sin, base, row, stride_c, cols, partner, live,
                                             turned)
    normed = (values * scale * (1.0 + w))
    normed = normed.to(dest.dtype.element_ty).to(tl.float32)
    other = (other * scale * (1.0 + w_other))
    other = other.to(dest.dtype.element_ty).to(tl.float32)
    other = tl.where(cols < half, -other, other)
    # each product rounded, then the sum (widened through the bits: a cast back lets the compiler
    # contract the pair into one bf16 fma, the products unrounded)
    rotated = widened((normed * c).to(dest.dtype.element_ty)) + widened((other * s).to(dest.dtype.element_ty))
    result = tl.where(turned, rotated, normed)
    tl.store(dest + cols, result.to(dest.dtype.element_ty), mask=live)


def norm_rope(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float
              ) -> torch.Tensor:
    """RoPE(zrms(x)) per head for ``x`` [rows, heads, head_dim]; a new contiguous tensor."""
    _check(x, weight, cos, sin)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(x, weight, out, x, weight, out, 0, cos, sin, eps)
    return out


def norm_rope_pair(x: torch.Tensor, x_weight: torch.Tensor, y: torch.Tensor, y_weight: torch.Tensor,
                   cos: torch.Tensor, sin: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``norm_rope`` of x and of y (attention's q and k: the same rows, angles and head_dim, their
    own weights and heads) in one launch; the same bits as two calls."""
    _check(x, x_weight, cos, sin)
    _check(y, y_weight, cos, sin)
    if y.shape[0] != x.shape[0] or y.shape[2] != x.shape[2]:
        raise ValueError(f"y {list(y.shape)} must have x's rows and head_dim, x is {list(x.shape)}")
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y_out = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    _launch(x, x_weight, out, y, y_weight, y_out, y.shape[1], cos, sin, eps)
    return out, y_out


def norm_rope_store(x: torch.Tensor, x_weight: torch.Tensor, y: torch.Tensor, y_weight: torch.Tensor,
                    v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, page_table: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``norm_rope`` of x, returned, and of y with v stored into the caches at each lane's last
    position as ``tfd_kernels.cache_write.write`` stores them (decode: a row per lane, ``lengths`` [lanes]
    its visible keys, 0 for a padding lane, which stores nothing), all in one launch; the same bits
    as ``norm_rope_pair`` then ``cache_write.write``."""
    _check(x, x_weight, cos, sin)
    _check(y, y_weight, cos, sin)
    cache_write.check(y, v, k_cache, v_cache, page_table, lengths)
    lanes, heads, dim = y.shape
    if x.shape[0] != lanes or x.shape[2] != dim or v.stride(2) != 1:
        raise ValueError(f"x {list(x.shape)} and y {list(y.shape)} must share rows and head_dim, and v "
                         f"{list(v.shape)} have a unit last stride")
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if lanes:
        _norm_rope_store[(lanes, x.shape[1] + 2 * heads)](
            x, x_weight, cos, sin, out, dim, cos.shape[1], x.stride(0), x.stride(1), cos.stride(0),
            x.shape[1], eps, y, y_weight, y.stride(0), y.stride(1), heads, v, v.stride(0), v.stride(1),
            k_cache, v_cache, page_table, lengths, k_cache.shape[1], page_table.stride(0), k_cache.stride(0),
            k_cache.stride(1), k_cache.stride(2), BLOCK=triton.next_power_of_2(dim),
            LOADS_FIRST=LOADS_FIRST, **pdl.options(x.device))
    return out


def _check(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    if x.dim() != 3 or x.stride(2) != 1:
        raise ValueError(f"x must be [rows, heads, head_dim] with unit last stride, got {list(x.shape)}")
    rows, _, head_dim = x.shape
    rotary = cos.shape[1]
    if weight.shape != (head_dim,) or cos.shape != (rows, rotary) or sin.shape != cos.shape or rotary % 2 \
            or rotary > head_dim or cos.stride(1) != 1 or sin.stride() != cos.stride():
        raise ValueError(f"weight {list(weight.shape)}, cos {list(cos.shape)} and sin {list(sin.shape)} "
                         f"do not fit x {list(x.shape)}")


def _launch(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, y: torch.Tensor, y_weight: torch.Tensor,
            y_out: torch.Tensor, y_heads: int, cos: torch.Tensor, sin: torch.Tensor, eps: float) -> None:
    """x's heads, then y's ``y_heads`` (none: y is not read), a program per (row, head)."""
    rows, heads, head_dim = x.shape
    if rows:
        _norm_rope[(rows, heads + y_heads)](x, weight, cos, sin, out, head_dim, cos.shape[1], x.stride(0),
                                            x.stride(1), cos.stride(0), heads, eps, y, y_weight, y_out,
                                            y.stride(0), y.stride(1), y_heads,
                                            BLOCK=triton.next_power_of_2(head_dim), LOADS_FIRST=LOADS_FIRST,
                                            **pdl.options(x.device))

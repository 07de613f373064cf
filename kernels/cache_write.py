"""Store each lane's decode-row K and V into its pages: the row at position ``lengths - 1``.

Touches only the one row per live lane (page ``page_table[lane, p // page_rows]``, slot
``p % page_rows``); a padding lane (length 0) writes nothing, so the pool's null page stays zero.
The caches are strided views ``[pages + 1, page_rows, kv_heads, head_dim]`` into the pool.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import pdl


@triton.jit
def last_row(page_table, stride_tl, lane, length, page_rows, stride_cp, stride_cr):
    """The cache element offset of the row at a live lane's last position (``length - 1``): its
    page from the lane's table, then the slot in it (shared with tfd_kernels.rope's decode store)."""
    position = length - 1
    page = tl.load(page_table + lane * stride_tl + position // page_rows).to(tl.int64)
    return page * stride_cp + (position % page_rows) * stride_cr


@triton.jit
def _write(k, v, k_cache, v_cache, page_table, lengths, page_rows, stride_tl, stride_kl, stride_kh,
           stride_vl, stride_vh, stride_cp, stride_cr, stride_ch, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
           PDL: tl.constexpr):
    pdl.wait(PDL)
    lane = tl.program_id(0)
    head = tl.program_id(1)
    length = tl.load(lengths + lane)
    if length > 0:
        dims = tl.arange(0, BLOCK)
        mask = dims < HEAD_DIM
        target = last_row(page_table, stride_tl, lane, length, page_rows, stride_cp, stride_cr) \
            + head * stride_ch + dims
        key = tl.load(k + lane * stride_kl + head * stride_kh + dims, mask=mask)
        value = tl.load(v + lane * stride_vl + head * stride_vh + dims, mask=mask)
        tl.store(k_cache + target, key, mask=mask)
        tl.store(v_cache + target, value, mask=mask)


def check(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
          page_table: torch.Tensor, lengths: torch.Tensor) -> None:
    """ValueError unless ``k``/``v`` [lanes, kv_heads, head_dim] fit the caches, the page table and
    ``lengths`` (shared with tfd_kernels.rope's decode store)."""
    lanes, heads, dim = k.shape
    if v.shape != k.shape or k_cache.shape[2:] != (heads, dim) or v_cache.stride() != k_cache.stride():
        raise ValueError(f"k {list(k.shape)}, v {list(v.shape)} and caches {list(k_cache.shape)} disagree")
    if page_table.shape[0] != lanes or lengths.shape != (lanes,):
        raise ValueError(f"page_table {list(page_table.shape)} and lengths {list(lengths.shape)} "
                         f"must have {lanes} lanes")
    if k_cache.stride(3) != 1:
        raise ValueError(f"k_cache must be contiguous along head_dim, its strides are {k_cache.stride()}")


def write(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
          page_table: torch.Tensor, lengths: torch.Tensor) -> None:
    """``k``/``v`` [lanes, kv_heads, head_dim] into the caches at each lane's last position."""
    check(k, v, k_cache, v_cache, page_table, lengths)
    lanes, heads, dim = k.shape
    k = k if k.stride(2) == 1 else k.contiguous()  # rows and heads at any stride: views of the projection
    v = v if v.stride(2) == 1 else v.contiguous()
    _write[(lanes, heads)](k, v, k_cache, v_cache, page_table, lengths, k_cache.shape[1],
                           page_table.stride(0), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                           k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), HEAD_DIM=dim,
                           BLOCK=triton.next_power_of_2(dim), **pdl.options(k.device))


def reference(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              page_table: torch.Tensor, lengths: torch.Tensor) -> None:
    """The same stores in torch (the live lanes read back to the host)."""
    page_rows = k_cache.shape[1]
    for lane, length in enumerate(lengths.tolist()):
        if length > 0:
            page = int(page_table[lane, (length - 1) // page_rows])
            k_cache[page, (length - 1) % page_rows] = k[lane]
            v_cache[page, (length - 1) % page_rows] = v[lane]

"""Softmax attention of each query row over its own list of key positions, read through page tables.

Qwen Sparse Attention gives every query row a set of positions (the chosen blocks and the tail,
``tfd.model.qsa``): row r of a call reads lane ``lane_of[r]``'s keys at ``positions[r, :counts[r]]``
(ascending, the rest of the row is padding), through that lane's page-table row, K/V caches laid
out as in ``tfd_kernels.paged_attention``. Query head h reads kv head h // (heads // kv_heads), the
group packed along the M side of ``tl.dot``; scores, softmax and the P @ V sums are fp32, the output
cast to q's dtype.

Memory: reads q, each row's positions and the page-table entries and K/V rows they name, writes out;
no gather copy. One program a (row, kv head) walks the row's positions in blocks of a size fixed by
head_dim, always from the first, so a row's bits depend on its query and its positions alone, never
on the other rows or their count. Grids follow shapes only: no host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import pdl
from tfd_kernels.paged_attention import LOG2E, attend_block
from tfd_kernels.runtime import INTERPRETED


@triton.jit
def _sparse(q, k_cache, v_cache, page_table, lane_of, positions, counts, out, scale_log2,
            stride_qr, stride_qh, stride_kp, stride_ks, stride_kh, stride_kd, stride_vp, stride_vs, stride_vh,
            stride_vd, stride_tb, stride_pr, stride_or, stride_oh,
            PAGE_ROWS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
            BLOCK_N: tl.constexpr, WIDEN: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    row, kv_head = tl.program_id(0), tl.program_id(1)
    lane = tl.load(lane_of + row)
    count = tl.load(counts + row)
    members = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + members
    live = members < GROUP
    query = tl.load(q + row * stride_qr + heads[:, None] * stride_qh + dims[None, :], mask=live[:, None],
                    other=0.0)
    m_i = tl.full((GROUP_PAD,), float("-inf"), tl.float32)
    l_i = tl.zeros((GROUP_PAD,), tl.float32)
    acc = tl.zeros((GROUP_PAD, HEAD_DIM), tl.float32)
    for start in range(0, count, BLOCK_N):  # the first block holds the row's first position
        at = start + tl.arange(0, BLOCK_N)
        valid = at < count
        key = tl.load(positions + row * stride_pr + at, mask=valid, other=0)
        pages = tl.load(page_table + lane * stride_tb + key // PAGE_ROWS, mask=valid, other=0)
        m_i, l_i, acc = attend_block(query, k_cache, v_cache, pages, key % PAGE_ROWS, valid,
                                     valid[None, :], kv_head, dims, scale_log2, m_i, l_i, acc,
                                     stride_kp, stride_ks, stride_kh, stride_kd,
                                     stride_vp, stride_vs, stride_vh, stride_vd, WIDEN)
    result = acc / l_i[:, None]
    tl.store(out + row * stride_or + heads[:, None] * stride_oh + dims[None, :],
             result.to(out.dtype.element_ty), mask=live[:, None])


def _check_caches(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> int:
    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(f"q {list(q.shape)} must be [rows, heads, d] and the caches [pages + 1, page "
                         f"rows, kv_heads, d], got {list(k_cache.shape)} and {list(v_cache.shape)}")
    heads, kv_heads = q.shape[1], k_cache.shape[2]
    if heads % kv_heads or q.shape[2] != k_cache.shape[3]:
        raise ValueError(f"q has {heads} heads of {q.shape[2]}, the caches {kv_heads} of "
                         f"{k_cache.shape[3]}")
    return heads // kv_heads


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
           lane_of: torch.Tensor, positions: torch.Tensor, counts: torch.Tensor, scale: float,
           out: torch.Tensor) -> torch.Tensor:
    """Row r of ``q`` [rows, heads, d] over lane ``lane_of[r]``'s keys at ``positions[r, :counts[r]]``
    (int32 [rows, width] and [rows]; ``page_table`` int32 [lanes, pages]; ``lane_of`` int32 [rows]),
    into ``out`` [rows, heads, d]; every row has at least one position. Returns ``out``."""
    group = _check_caches(q, k_cache, v_cache)
    rows = q.shape[0]
    for name, t, shape in (("lane_of", lane_of, (rows,)), ("counts", counts, (rows,)),
                           ("positions", positions, (rows, positions.shape[-1]))):
        if tuple(t.shape) != shape or t.dtype != torch.int32:
            raise ValueError(f"{name} is {t.dtype} {list(t.shape)}, expected int32 {list(shape)}")
    if page_table.dim() != 2 or page_table.dtype != torch.int32 or out.shape != q.shape:
        raise ValueError(f"page_table must be int32 [lanes, pages] and out like q, got "
                         f"{page_table.dtype} {list(page_table.shape)} and {list(out.shape)}")
    if q.stride(2) != 1 or out.stride(2) != 1:
        raise ValueError("q and out need a unit stride along head_dim")
    if rows == 0:
        return out
    head_dim, kv_heads = q.shape[2], k_cache.shape[2]
    positions, page_table = positions.contiguous(), page_table.contiguous()
    _sparse[(rows, kv_heads)](
        q, k_cache, v_cache, page_table, lane_of.contiguous(), positions, counts.contiguous(), out,
        scale * LOG2E, q.stride(0), q.stride(1), *k_cache.stride(), *v_cache.stride(), page_table.stride(0),
        positions.stride(0),
        out.stride(0), out.stride(1), PAGE_ROWS=k_cache.shape[1], GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim, BLOCK_N=64, WIDEN=INTERPRETED,
        num_warps=4, **pdl.options(q.device))
    return out


def reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
              lane_of: torch.Tensor, positions: torch.Tensor, counts: torch.Tensor, scale: float,
              out: torch.Tensor) -> torch.Tensor:
    """``attend`` in torch, a row at a time."""
    group = _check_caches(q, k_cache, v_cache)
    page_rows = k_cache.shape[1]
    for row in range(q.shape[0]):
        keys_at = positions[row, :int(counts[row])].long()
        pages = page_table[int(lane_of[row]), keys_at // page_rows].long()
        slots = keys_at % page_rows
        keys, values = k_cache[pages, slots].float(), v_cache[pages, slots].float()
        query = q[row].float().view(keys.shape[1], group, -1)
        weights = torch.softmax(torch.einsum("kgd,nkd->kgn", query, keys) * scale, dim=-1)
        out[row] = torch.einsum("kgn,nkd->kgd", weights, values).reshape(q.shape[1:]).to(out.dtype)
    return out

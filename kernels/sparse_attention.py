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

Decode rows (``attend(..., split=True)``: a decode step's and a verify window's, which must agree
with each other, not with a prompt's) cut a row's positions into segments of ``SEGMENT`` from its
first, one program a (row, kv head, segment), each writing its fp32 running max, sum and P @ V
(``tfd_kernels.paged_attention``'s partials), merged in segment order by paged attention's merge: a
one-stream row of 2,051 positions was two programs walking 33 blocks each in turn (H200 Flash Next,
~190 us a QSA layer at a 32k context, ~77 us at 1k). The split follows the row's count alone, so its
bits still do not depend on the batch. Scratch: the partials, rows x segments x heads x (head_dim +
4) fp32, freed on return.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import paged_attention, pdl
from tfd_kernels.paged_attention import LOG2E, STATS, attend_block, store_partial
from tfd_kernels.runtime import INTERPRETED

# Positions a decode program attends (a row's split: its count's, never the batch's) and its key block.
# Ints, so that tfd bench --variant can sweep them.
SEGMENT = 64
SEGMENT_BLOCK = 32
# Whether decode rows take the segments (tfd.model.attention.sparse_rows): an int for tfd bench --variant.
# H100, Flash Next one stream (8 of 48 layers), best of two: 1.5952 ms a step against 1.7130 whole at a
# 1,024-token prompt, 1.6956 against 1.9440 at 32,768 (docs/bench.md, 2026-12-07); its GPU tests with the
# model's (device path, verify windows, drafting) passed.
DECODE_SEGMENTS = 1


@triton.jit
def _walk(query, k_cache, v_cache, page_table, lane, positions, row, first, end, kv_head, dims, scale_log2,
          m_i, l_i, acc, stride_kp, stride_ks, stride_kh, stride_kd, stride_vp, stride_vs, stride_vh,
          stride_vd, stride_tb, stride_pr, PAGE_ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
          WIDEN: tl.constexpr):
    """The running softmax over a row's positions ``first .. end``, a block of BLOCK_N at a time."""
    for start in range(first, end, BLOCK_N):  # the first block holds a position: m_i turns finite
        at = start + tl.arange(0, BLOCK_N)
        valid = at < end
        key = tl.load(positions + row * stride_pr + at, mask=valid, other=0)
        pages = tl.load(page_table + lane * stride_tb + key // PAGE_ROWS, mask=valid, other=0)
        m_i, l_i, acc = attend_block(query, k_cache, v_cache, pages, key % PAGE_ROWS, valid,
                                     valid[None, :], kv_head, dims, scale_log2, m_i, l_i, acc,
                                     stride_kp, stride_ks, stride_kh, stride_kd,
                                     stride_vp, stride_vs, stride_vh, stride_vd, WIDEN)
    return m_i, l_i, acc


@triton.jit
def _group(q, row, kv_head, stride_qr, stride_qh, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
           HEAD_DIM: tl.constexpr):
    """A (row, kv head)'s query heads packed along M: (query, heads, live, dims)."""
    members = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + members
    live = members < GROUP
    query = tl.load(q + row * stride_qr + heads[:, None] * stride_qh + dims[None, :], mask=live[:, None],
                    other=0.0)
    return query, heads, live, dims


@triton.jit
def _segment(q, k_cache, v_cache, page_table, lane_of, positions, counts, partials, scale_log2,
             stride_qr, stride_qh, stride_kp, stride_ks, stride_kh, stride_kd, stride_vp, stride_vs,
             stride_vh, stride_vd, stride_tb, stride_pr, stride_pb, stride_ps, stride_ph,
             PAGE_ROWS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
             SEG: tl.constexpr, BLOCK_N: tl.constexpr, WIDEN: tl.constexpr, PDL: tl.constexpr):
    """A (row, kv head, segment): the segment's positions into its heads' partials (past the row's
    count: nothing)."""
    pdl.wait(PDL)
    row, kv_head, segment = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    count = tl.load(counts + row)
    first = segment * SEG
    if first < count:
        lane = tl.load(lane_of + row)
        query, heads, live, dims = _group(q, row, kv_head, stride_qr, stride_qh, GROUP, GROUP_PAD, HEAD_DIM)
        m_i = tl.full((GROUP_PAD,), float("-inf"), tl.float32)
        l_i = tl.zeros((GROUP_PAD,), tl.float32)
        acc = tl.zeros((GROUP_PAD, HEAD_DIM), tl.float32)
        m_i, l_i, acc = _walk(query, k_cache, v_cache, page_table, lane, positions, row, first,
                              tl.minimum(first + SEG, count), kv_head, dims, scale_log2, m_i, l_i, acc,
                              stride_kp, stride_ks, stride_kh, stride_kd, stride_vp, stride_vs, stride_vh,
                              stride_vd, stride_tb, stride_pr, PAGE_ROWS, BLOCK_N, WIDEN)
        at = partials + row * stride_pb + segment * stride_ps + heads * stride_ph
        store_partial(at, acc, m_i, l_i, dims, live, HEAD_DIM)


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
    query, heads, live, dims = _group(q, row, kv_head, stride_qr, stride_qh, GROUP, GROUP_PAD, HEAD_DIM)
    m_i = tl.full((GROUP_PAD,), float("-inf"), tl.float32)
    l_i = tl.zeros((GROUP_PAD,), tl.float32)
    acc = tl.zeros((GROUP_PAD, HEAD_DIM), tl.float32)
    m_i, l_i, acc = _walk(query, k_cache, v_cache, page_table, lane, positions, row, 0, count, kv_head,
                          dims, scale_log2, m_i, l_i, acc, stride_kp, stride_ks, stride_kh, stride_kd,
                          stride_vp, stride_vs, stride_vh, stride_vd, stride_tb, stride_pr, PAGE_ROWS,
                          BLOCK_N, WIDEN)
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
           out: torch.Tensor, split: bool = False, gate: torch.Tensor | None = None) -> torch.Tensor:
    """Row r of ``q`` [rows, heads, d] over lane ``lane_of[r]``'s keys at ``positions[r, :counts[r]]``
    (int32 [rows, width] and [rows]; ``page_table`` int32 [lanes, pages]; ``lane_of`` int32 [rows]),
    into ``out`` [rows, heads, d]; every row has at least one position. ``split``: decode rows, in
    segments of ``SEGMENT`` positions merged (other bits than a prompt's rows get); then ``gate``
    (like q, unit last stride: attention's output gate) makes ``out`` the gated output, the bits of
    ``tfd_kernels.sigmoid_gate`` on the plain one. Returns ``out``."""
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
    if gate is not None and (not split or gate.shape != q.shape or gate.stride(2) != 1
                             or gate.dtype != out.dtype):
        raise ValueError(f"gate is {list(gate.shape)} {gate.dtype}{'' if split else ' without split'}: want "
                         f"q's shape {list(q.shape)} in {out.dtype}, unit last stride, decode rows (split)")
    if split:
        return _split(q, k_cache, v_cache, page_table, lane_of.contiguous(), positions, counts.contiguous(),
                      scale, out, group, gate)
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


def _split(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
           lane_of: torch.Tensor, positions: torch.Tensor, counts: torch.Tensor, scale: float,
           out: torch.Tensor, group: int, gate: torch.Tensor | None) -> torch.Tensor:
    """``attend``'s decode rows: the segments' launch, then paged attention's merge of their partials
    (gating them with ``gate`` where given)."""
    rows, heads, head_dim = q.shape
    width = positions.shape[1]
    segments = triton.cdiv(width, SEGMENT)
    partials = torch.empty(rows, segments, heads, head_dim + STATS, dtype=torch.float32, device=q.device)
    _segment[(rows, k_cache.shape[2], segments)](
        q, k_cache, v_cache, page_table, lane_of, positions, counts, partials, scale * LOG2E, q.stride(0),
        q.stride(1), *k_cache.stride(), *v_cache.stride(), page_table.stride(0), positions.stride(0),
        *partials.stride()[:3], PAGE_ROWS=k_cache.shape[1], GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim, SEG=SEGMENT,
        BLOCK_N=min(SEGMENT_BLOCK, SEGMENT), WIDEN=INTERPRETED, num_warps=4, **pdl.options(q.device))
    # the merge's segment count from each row's count: every segment SEGMENT long (no short ones first)
    gates = out if gate is None else gate  # not read without GATED
    paged_attention._decode_merge[(rows, heads)](
        partials, counts, out, gates, out, out, width, *partials.stride()[:3], *out.stride(), gates.stride(0),
        gates.stride(1), 0, 0, HEAD_DIM=head_dim, SHORT=SEGMENT, SHORT_KEYS=0, SEG=SEGMENT,
        BLOCK_S=paged_attention.MERGE_BLOCK, GATED=gate is not None,
        FIRST=True, QUANTIZE=False, EXACT_CAST=INTERPRETED, num_warps=4, **pdl.options(out.device))
    return out

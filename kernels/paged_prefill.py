"""Causal attention of prompt rows over a lane's cached prefix and its own rows, through page tables.

Each lane's rows ``q[cu_seqlens[b]:cu_seqlens[b + 1]]`` sit at absolute positions from
``starts[b]`` and see the keys up to their own position, K/V caches and GQA packing as in
``tfd_kernels.paged_attention`` (whose ``attend_block`` each tile runs a key block at a time). Scores,
softmax and the P @ V sums are fp32; the output is cast to q's dtype. ``reference_prefill`` is the
torch reference.

Keys are cut into spans of ``SPAN`` at fixed positions from 0; a row's softmax is each span's own
(max, sum of exp, P @ V), merged span after span from span 0 upwards. A long chunk's tiles (many
programs) walk their spans one after another and merge as they go; a short chunk's (a resumed turn's
few rows over a long prefix: a dozen programs walking 30,000 keys left most of the GPU idle, 2.7 ms a
layer on the H200) give each span a program of its own, whose partials a second launch merges in
the same order with the same arithmetic (``merged``, its sums fused explicitly): the same bits.

Memory: reads q, the page-table entries and K/V rows of the keys it needs (no gather copy), writes
out; a short chunk also writes and reads fp32 partials, one row a (span, row, head), in scratch it
allocates (at most ``SCRATCH_BYTES``; past that it walks its spans one after another).

Batch invariance: tiles of query rows sit at fixed multiples of ``BLOCK_Q`` absolute positions and
walk key blocks aligned at multiples of the block size from position 0, span by span. A tile never
straddles a span's start (``SPAN`` is a multiple of every ``BLOCK_Q``), so every row sees its span's
first key: each span's max is finite. A tile may visit blocks past some of its rows' last key: those
rows see only -inf scores there, so their running max stays, the rescale factor is exactly 1 and
they add exact zeros. A row's bits thus depend on its absolute position and its lane's keys only,
not on the chunk, the other rows or whether its spans ran apart. The grid depends on shapes and the
host's ``max_rows`` only: no host sync when it is given, CUDA-graph safe. Keys past the page table's
``max_pages * page_rows`` are clamped to it on the device.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from tfd_kernels import pdl
from tfd_kernels.paged_attention import (
    LOG2E,
    STATS,
    attend_block,
    attend_rows,
    cache_strides,
    checked_group,
    gathered,
)
from tfd_kernels.runtime import INTERPRETED

PREFILL_M = 128  # prefill tile rows along M: query rows x group members
SPAN = 2048  # keys a span covers: fixed, so a row's merges never depend on the chunk
SCRATCH_BYTES = 256 << 20  # a short chunk's partials at most; past it its tiles walk their spans
MERGE_M, MERGE_DIMS = 16, 64  # (row, member) pairs and dims a merge program takes (powers of two)


def _prefill_config(group_pad: int) -> dict[str, int]:
    """Tile and launch sizes of a prefill tile; best of those timed on an H200 at head_dim 256."""
    return {"BLOCK_Q": max(1, PREFILL_M // group_pad), "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}


@functools.cache
def _programs_to_fill(device: torch.device) -> int:
    """Programs below which a launch leaves multiprocessors idle: split a short chunk's spans then."""
    if device.type != "cuda":
        return 0
    return torch.cuda.get_device_properties(device).multi_processor_count


@triton.jit
def merged(m_run, l_run, acc_run, m_span, l_span, acc_span):
    """A span's (max, sum of exp, P @ V) merged into the running ones; both sums fused explicitly,
    so the walking tile and the merge launch round alike. From (-inf, 0, 0) it gives the span's."""
    m_new = tl.maximum(m_run, m_span)
    alpha = tl.exp2(m_run - m_new)
    beta = tl.exp2(m_span - m_new)
    return (m_new, tl.fma(l_run, alpha, l_span * beta),
            tl.fma(acc_run, alpha[:, None] + tl.zeros_like(acc_run), acc_span * beta[:, None]))


@triton.jit
def _tile_rows(starts, cu_seqlens, max_keys, lane, tile_index, first_m, BLOCK_Q: tl.constexpr,
               GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, M: tl.constexpr):
    """``M`` of a tile's (row, group member) pairs from the ``first_m``-th: their positions, query
    heads (within the kv head's group), whether each is the chunk's, the last key each sees, their
    rows in q, and the tile's end of keys (0: no rows)."""
    first_row = tl.load(cu_seqlens + lane)
    start = tl.load(starts + lane)
    end = tl.minimum(start + tl.load(cu_seqlens + lane + 1) - first_row, max_keys)
    tile = start // BLOCK_Q + tile_index  # tiles sit at multiples of BLOCK_Q absolute positions
    m = first_m + tl.arange(0, M)
    positions = tile * BLOCK_Q + m // GROUP_PAD
    members = m % GROUP_PAD
    live = (positions >= start) & (positions < end) & (members < GROUP)
    limit = tl.minimum(positions, end - 1)  # rows outside the chunk still see key 0: no NaN anywhere
    rows = (first_row + positions - start).to(tl.int64)
    last = tl.where(tile * BLOCK_Q < end, tl.minimum(tile * BLOCK_Q + BLOCK_Q, end), 0)
    return members, live, limit, rows, last


@triton.jit
def _span(query, k_cache, v_cache, page_table, lane, kv_head, dims, limit, first, last, scale_log2,
          stride_kp, stride_ks, stride_kh, stride_kd, stride_vp, stride_vs, stride_vh, stride_vd,
          stride_tb, stride_tp, PAGE_ROWS: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
          BLOCK_N: tl.constexpr, WIDEN: tl.constexpr):
    """The rows' softmax over keys ``first .. last`` alone: (max, sum of exp, P @ V)."""
    m_i = tl.full((ROWS,), float("-inf"), tl.float32)
    l_i = tl.zeros((ROWS,), tl.float32)
    acc = tl.zeros((ROWS, HEAD_DIM), tl.float32)
    for block in range(first, last, BLOCK_N):  # blocks at fixed multiples, upwards
        keys = block + tl.arange(0, BLOCK_N)
        valid = keys < last
        pages = tl.load(page_table + lane * stride_tb + (keys // PAGE_ROWS) * stride_tp, mask=valid, other=0)
        seen = keys[None, :] <= limit[:, None]  # a row whose block is all hidden rescales by exactly 1
        m_i, l_i, acc = attend_block(query, k_cache, v_cache, pages, keys % PAGE_ROWS, valid, seen, kv_head,
                                     dims, scale_log2, m_i, l_i, acc, stride_kp, stride_ks, stride_kh,
                                     stride_kd, stride_vp, stride_vs, stride_vh, stride_vd, WIDEN)
    return m_i, l_i, acc


# counts that vary call by call are not specialized on (1, multiples of 16): one variant meets them all; so
# the page table's row stride (its width follows the step's longest lane) and the partials' span stride (the
# step's rows): the H100's demo compiled a variant of an odd width while serving (2026-12-05)
@triton.jit(do_not_specialize=["max_keys", "spans", "stride_tb", "stride_ps"])
def _prefill_tile(q, k_cache, v_cache, page_table, starts, cu_seqlens, out, partials, scale_log2, max_keys,
                  spans,
                  stride_qt, stride_qh, stride_qd, stride_kp, stride_ks, stride_kh, stride_kd,
                  stride_vp, stride_vs, stride_vh, stride_vd, stride_tb, stride_tp,
                  stride_ot, stride_oh, stride_od, stride_ps, stride_pt, stride_ph,
                  PAGE_ROWS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                  HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, SPAN: tl.constexpr,
                  SPLIT: tl.constexpr, WIDEN: tl.constexpr, PDL: tl.constexpr):
    """One tile of a lane's rows for one kv head: every span, merged (``SPLIT`` off), or the span
    ``program_id(2) % spans`` alone, its partials written for ``_prefill_merge``."""
    pdl.wait(PDL)
    lane = tl.program_id(1)
    kv_head = tl.program_id(2) // spans
    members, live, limit, rows, last = _tile_rows(starts, cu_seqlens, max_keys, lane, tl.program_id(0), 0,
                                                  BLOCK_Q, GROUP, GROUP_PAD, BLOCK_Q * GROUP_PAD)
    heads = kv_head * GROUP + members
    dims = tl.arange(0, HEAD_DIM)
    query = tl.load(q + rows[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
                    mask=live[:, None], other=0.0)
    if SPLIT:
        first = (tl.program_id(2) % spans) * SPAN
        if first < last:
            m_i, l_i, acc = _span(query, k_cache, v_cache, page_table, lane, kv_head, dims, limit, first,
                                  tl.minimum(first + SPAN, last), scale_log2, stride_kp, stride_ks, stride_kh,
                                  stride_kd, stride_vp, stride_vs, stride_vh, stride_vd, stride_tb, stride_tp,
                                  PAGE_ROWS,
                                  BLOCK_Q * GROUP_PAD, HEAD_DIM, BLOCK_N, WIDEN)
            at = partials + (first // SPAN) * stride_ps + rows * stride_pt + heads * stride_ph
            tl.store(at[:, None] + dims[None, :], acc, mask=live[:, None])
            tl.store(at + HEAD_DIM, m_i, mask=live)
            tl.store(at + HEAD_DIM + 1, l_i, mask=live)
    elif last > 0:
        m_run = tl.full((BLOCK_Q * GROUP_PAD,), float("-inf"), tl.float32)
        l_run = tl.zeros((BLOCK_Q * GROUP_PAD,), tl.float32)
        acc_run = tl.zeros((BLOCK_Q * GROUP_PAD, HEAD_DIM), tl.float32)
        for first in range(0, last, SPAN):  # from span 0 upwards
            m_i, l_i, acc = _span(query, k_cache, v_cache, page_table, lane, kv_head, dims, limit, first,
                                  tl.minimum(first + SPAN, last), scale_log2, stride_kp, stride_ks, stride_kh,
                                  stride_kd, stride_vp, stride_vs, stride_vh, stride_vd, stride_tb, stride_tp,
                                  PAGE_ROWS,
                                  BLOCK_Q * GROUP_PAD, HEAD_DIM, BLOCK_N, WIDEN)
            m_run, l_run, acc_run = merged(m_run, l_run, acc_run, m_i, l_i, acc)
        tl.store(out + rows[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :] * stride_od,
                 (acc_run / l_run[:, None]).to(out.dtype.element_ty), mask=live[:, None])


# counts that vary call by call are not specialized on (1, multiples of 16): one variant meets them all
@triton.jit(do_not_specialize=["max_keys", "stride_ps"])
def _prefill_merge(starts, cu_seqlens, out, partials, max_keys, stride_ot, stride_oh, stride_od,
                   stride_ps, stride_pt, stride_ph, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                   HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, SPAN: tl.constexpr, M: tl.constexpr,
                   DIMS: tl.constexpr, PDL: tl.constexpr):
    """A split tile's spans merged from span 0 upwards, as the walking tile merges them: ``M`` of
    its (row, member) pairs and ``DIMS`` of their dims a program (the merge is elementwise, so the
    cut changes no bits; a whole tile a program spilled its registers, 0.6 ms a layer on the H200)."""
    pdl.wait(PDL)
    lane = tl.program_id(1)
    pieces = BLOCK_Q * GROUP_PAD // M
    kv_head = tl.program_id(2) // (HEAD_DIM // DIMS)
    members, live, _, rows, last = _tile_rows(starts, cu_seqlens, max_keys, lane, tl.program_id(0) // pieces,
                                              (tl.program_id(0) % pieces) * M, BLOCK_Q, GROUP, GROUP_PAD, M)
    if last > 0:
        heads = kv_head * GROUP + members
        dims = (tl.program_id(2) % (HEAD_DIM // DIMS)) * DIMS + tl.arange(0, DIMS)
        m_run = tl.full((M,), float("-inf"), tl.float32)
        l_run = tl.zeros((M,), tl.float32)
        acc_run = tl.zeros((M, DIMS), tl.float32)
        for first in range(0, last, SPAN):
            at = partials + (first // SPAN) * stride_ps + rows * stride_pt + heads * stride_ph
            acc = tl.load(at[:, None] + dims[None, :], mask=live[:, None], other=0.0)
            m_i = tl.load(at + HEAD_DIM, mask=live, other=0.0)  # pairs not stored: finite, never written out
            l_i = tl.load(at + HEAD_DIM + 1, mask=live, other=1.0)
            m_run, l_run, acc_run = merged(m_run, l_run, acc_run, m_i, l_i, acc)
        tl.store(out + rows[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :] * stride_od,
                 (acc_run / l_run[:, None]).to(out.dtype.element_ty), mask=live[:, None])


def prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
            starts: torch.Tensor, cu_seqlens: torch.Tensor, scale: float, out: torch.Tensor, *,
            max_rows: int | None = None, span: int = SPAN, split: bool | None = None) -> torch.Tensor:
    """Causal attention of each lane's rows ``q[cu_seqlens[b]:cu_seqlens[b + 1]]`` (absolute positions
    from ``starts[b]``) over its keys up to each row's position, into ``out``. ``max_rows`` bounds any
    lane's rows (the grid's size); None reads it from ``cu_seqlens`` (a host sync). ``span``: keys a
    span covers (a multiple of 128; the bits depend on it); ``split``: give each span a program of
    its own (None: when the tiles alone would leave the device's multiprocessors idle; the bits are
    the same either way). Returns ``out``."""
    lanes = page_table.shape[0] if page_table.dim() == 2 else 0
    group = checked_group(q, k_cache, v_cache, page_table, out,
                          {"starts": (starts, lanes), "cu_seqlens": (cu_seqlens, lanes + 1)})
    if span <= 0 or span % PREFILL_M:
        raise ValueError(f"span must be a positive multiple of {PREFILL_M}, got {span}")
    if max_rows is None:
        max_rows = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if lanes else 0
    if max_rows < 0:
        raise ValueError(f"max_rows must be >= 0, got {max_rows}")
    if lanes == 0 or max_rows == 0 or q.shape[0] == 0:
        return out
    heads, head_dim, kv_heads = q.shape[1], q.shape[2], k_cache.shape[2]
    group_pad = triton.next_power_of_2(group)
    config = _prefill_config(group_pad)
    tiles = triton.cdiv(max_rows - 1, config["BLOCK_Q"]) + 1  # an unaligned chunk spans one more tile
    max_keys = page_table.shape[1] * k_cache.shape[1]
    spans = triton.cdiv(max_keys, span)
    scratch = spans * q.shape[0] * heads * (head_dim + STATS) * 4
    if split is None:
        few = tiles * lanes * kv_heads < _programs_to_fill(q.device)
        split = spans > 1 and few and scratch <= SCRATCH_BYTES
    partials = torch.empty(spans if split else 0, q.shape[0], heads, head_dim + STATS, dtype=torch.float32,
                           device=q.device)
    shared = (page_table, starts, cu_seqlens, out, partials, scale * LOG2E, max_keys, spans if split else 1,
              *q.stride(), *cache_strides(k_cache, v_cache, page_table), *out.stride(),
              *partials.stride()[:3])
    _prefill_tile[(tiles, lanes, kv_heads * (spans if split else 1))](
        q, k_cache, v_cache, *shared, PAGE_ROWS=k_cache.shape[1], GROUP=group, GROUP_PAD=group_pad,
        HEAD_DIM=head_dim, SPAN=span, SPLIT=split, WIDEN=INTERPRETED, **config, **pdl.options(q.device))
    if split:
        pairs = config["BLOCK_Q"] * group_pad
        m, dims = min(MERGE_M, pairs), min(MERGE_DIMS, head_dim)
        _prefill_merge[(tiles * (pairs // m), lanes, kv_heads * (head_dim // dims))](
            starts, cu_seqlens, out, partials, max_keys, *out.stride(), *partials.stride()[:3], GROUP=group,
            GROUP_PAD=group_pad, HEAD_DIM=head_dim, BLOCK_Q=config["BLOCK_Q"], SPAN=span, M=m, DIMS=dims,
            num_warps=2, **pdl.options(q.device))
    return out


def reference_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                      starts: torch.Tensor, cu_seqlens: torch.Tensor, scale: float, out: torch.Tensor, *,
                      max_rows: int | None = None) -> torch.Tensor:
    """``prefill`` by torch, gathering rows through the page table (``max_rows`` unused)."""
    bounds = cu_seqlens.tolist()
    for lane, start in enumerate(starts.tolist()):
        first, stop = bounds[lane], bounds[lane + 1]
        if stop == first:
            continue
        end = start + stop - first
        table = page_table[lane]
        keys, values = gathered(k_cache, table, end), gathered(v_cache, table, end)
        last = torch.arange(start, end, device=q.device)
        out[first:stop] = attend_rows(q[first:stop], keys, values, last, scale)
    return out

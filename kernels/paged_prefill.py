"""Causal attention of prompt rows over a lane's cached prefix and its own rows, through page tables.

Each lane's rows ``q[cu_seqlens[b]:cu_seqlens[b + 1]]`` sit at absolute positions from
``starts[b]`` and see the keys up to their own position, K/V caches and GQA packing as in
``kernels.paged_attention`` (whose ``attend_block`` each tile runs a key block at a time). Scores,
softmax and the P @ V sums are fp32; the output is cast to q's dtype. ``reference_prefill`` is the
torch reference.

Memory: reads q, the page-table entries and K/V rows of the keys it needs (no gather copy), writes
out; no scratch.

Batch invariance: tiles of query rows sit at fixed multiples of ``BLOCK_Q`` absolute positions and
walk key blocks aligned at multiples of the block size from position 0, always from block 0 upwards.
A tile may visit blocks past some of its rows' last key: those rows see only -inf scores there, so
their running max stays, the rescale factor is exactly 1 and they add exact zeros. A row's bits thus
depend on its absolute position and its lane's keys only, not on the chunk or the other rows. The
grid depends on shapes and the host's ``max_rows`` only: no host sync when it is given, CUDA-graph
safe. Keys past the page table's ``max_pages * page_rows`` are clamped to it on the device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import INTERPRETED, pdl
from kernels.paged_attention import LOG2E, attend_block, attend_rows, cache_strides, checked_group, gathered

PREFILL_M = 128  # prefill tile rows along M: query rows x group members


def _prefill_config(group_pad: int) -> dict[str, int]:
    """Tile and launch sizes of a prefill tile; best of those timed on an H200 at head_dim 256."""
    return {"BLOCK_Q": max(1, PREFILL_M // group_pad), "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}


@triton.jit
def _prefill_tile(q, k_cache, v_cache, page_table, starts, cu_seqlens, out, scale_log2, max_keys,
                  stride_qt, stride_qh, stride_qd, stride_kp, stride_ks, stride_kh, stride_kd,
                  stride_vp, stride_vs, stride_vh, stride_vd, stride_tb, stride_tp,
                  stride_ot, stride_oh, stride_od,
                  PAGE_ROWS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                  HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, WIDEN: tl.constexpr,
                  PDL: tl.constexpr):
    pdl.wait(PDL)
    lane = tl.program_id(1)
    kv_head = tl.program_id(2)
    first_row = tl.load(cu_seqlens + lane)
    start = tl.load(starts + lane)
    end = tl.minimum(start + tl.load(cu_seqlens + lane + 1) - first_row, max_keys)
    tile = start // BLOCK_Q + tl.program_id(0)  # tiles sit at multiples of BLOCK_Q absolute positions
    if tile * BLOCK_Q >= end:
        return
    m = tl.arange(0, BLOCK_Q * GROUP_PAD)
    positions = tile * BLOCK_Q + m // GROUP_PAD
    members = m % GROUP_PAD
    heads = kv_head * GROUP + members
    live = (positions >= start) & (positions < end) & (members < GROUP)
    limit = tl.minimum(positions, end - 1)  # rows outside the chunk still see key 0: no NaN anywhere
    rows = (first_row + positions - start).to(tl.int64)
    dims = tl.arange(0, HEAD_DIM)
    query = tl.load(q + rows[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
                    mask=live[:, None], other=0.0)
    m_i = tl.full((BLOCK_Q * GROUP_PAD,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_Q * GROUP_PAD,), tl.float32)
    acc = tl.zeros((BLOCK_Q * GROUP_PAD, HEAD_DIM), tl.float32)
    last = tl.minimum(tile * BLOCK_Q + BLOCK_Q, end)
    for block in range(0, last, BLOCK_N):  # from key 0 upwards, blocks at fixed multiples
        keys = block + tl.arange(0, BLOCK_N)
        valid = keys < last
        pages = tl.load(page_table + lane * stride_tb + (keys // PAGE_ROWS) * stride_tp, mask=valid, other=0)
        seen = keys[None, :] <= limit[:, None]  # a row whose block is all hidden rescales by exactly 1
        m_i, l_i, acc = attend_block(query, k_cache, v_cache, pages, keys % PAGE_ROWS, valid, seen, kv_head,
                                     dims, scale_log2, m_i, l_i, acc, stride_kp, stride_ks, stride_kh,
                                     stride_kd, stride_vp, stride_vs, stride_vh, stride_vd, WIDEN)
    result = acc / l_i[:, None]
    tl.store(out + rows[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :] * stride_od,
             result.to(out.dtype.element_ty), mask=live[:, None])


def prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
            starts: torch.Tensor, cu_seqlens: torch.Tensor, scale: float, out: torch.Tensor, *,
            max_rows: int | None = None) -> torch.Tensor:
    """Causal attention of each lane's rows ``q[cu_seqlens[b]:cu_seqlens[b + 1]]`` (absolute positions
    from ``starts[b]``) over its keys up to each row's position, into ``out``. ``max_rows`` bounds any
    lane's rows (the grid's size); None reads it from ``cu_seqlens`` (a host sync). Returns ``out``."""
    lanes = page_table.shape[0] if page_table.dim() == 2 else 0
    group = checked_group(q, k_cache, v_cache, page_table, out,
                          {"starts": (starts, lanes), "cu_seqlens": (cu_seqlens, lanes + 1)})
    if max_rows is None:
        max_rows = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if lanes else 0
    if max_rows < 0:
        raise ValueError(f"max_rows must be >= 0, got {max_rows}")
    if lanes == 0 or max_rows == 0 or q.shape[0] == 0:
        return out
    head_dim, kv_heads = q.shape[2], k_cache.shape[2]
    group_pad = triton.next_power_of_2(group)
    config = _prefill_config(group_pad)
    tiles = triton.cdiv(max_rows - 1, config["BLOCK_Q"]) + 1  # an unaligned chunk spans one more tile
    _prefill_tile[(tiles, lanes, kv_heads)](
        q, k_cache, v_cache, page_table, starts, cu_seqlens, out, scale * LOG2E,
        page_table.shape[1] * k_cache.shape[1], *q.stride(), *cache_strides(k_cache, v_cache, page_table),
        *out.stride(), PAGE_ROWS=k_cache.shape[1], GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim,
        WIDEN=INTERPRETED, **config, **pdl.options(q.device))
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

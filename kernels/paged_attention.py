"""Softmax attention of one query row per lane over K/V rows that sit in the pool's pages, read in place.

``decode`` takes one query row per lane (the lane's newest token) over its first ``lengths[lane]``
keys. Query head h reads kv head h // (heads // kv_heads); a kv head's query group is packed along
the M side of ``tl.dot`` so it uses tensor cores. Scores, softmax and the P @ V sums are fp32; the
output is cast to q's dtype. ``reference_decode`` is the torch reference. The pieces
``tfd_kernels.paged_prefill`` and ``tfd_kernels.sparse_attention`` share live here too: a key block's step
of the running softmax (``attend_block``), the argument checks and the torch references' attention.

Memory: K/V caches are ``[pages + 1, page_rows, kv_heads, head_dim]`` strided views into the pool
(any strides); position p of a lane is at page ``page_table[lane, p // page_rows]``, slot
``p % page_rows``. Decode reads the page-table entries and K/V rows of the keys it needs (no gather
copy) and q, writes one fp32 partial per (lane, segment, head) into the caller's ``partials``
scratch (``partials_for``), reads them back to merge, and writes out.

Batch invariance: a lane's keys are cut into segments at fixed positions from 0: the first
``SHORT_KEYS`` keys into segments of ``SHORT_SEGMENT`` (so a lane of a few thousand keys still
spreads over many programs, each a short chain of key blocks), the rest into ``SEGMENT``; and each
segment into key blocks of a size fixed by head_dim; one program does one (lane, kv head,
segment), and the merge sums a lane's segments in a fixed order. Nothing of that depends on the
other lanes, the number of lanes or the page-table width, so a lane's bits are the same alone or in
any batch. The grids depend on shapes only: no host sync, CUDA-graph safe. Lengths past the page
table's ``max_pages * page_rows`` keys are clamped to it on the device.

In Triton's interpreter (no GPU) bf16 dot operands are widened to fp32 first, which gives the same
products: the interpreter would otherwise multiply bf16 bit patterns as integers.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tfd_kernels import fp8_rows, pdl
from tfd_kernels.runtime import INTERPRETED
from tfd_kernels.sigmoid_gate import gated

SEGMENT = 512  # keys a decode program covers: fixed, so a lane's split never depends on the batch
# Keys up to SHORT_KEYS go in segments of SHORT_SEGMENT: a lane of 1,100 keys was 3 programs a kv head
# of 16 dependent key blocks each (about 20 us a layer at one lane on the H200), then 9 of 4, now 18 of 2
# (64 against 128: 35B-A3B one stream 2.637 against 2.665 ms a step, docs/bench.md).
# 32: one key block a segment. H200, tfd bench --variant, 35B-A3B one stream, 1024-token prompt, 96 new:
# with MERGE_BLOCK 32 2.3993 ms against 2.4106 (32 alone, merged in three blocks, 2.4133); 256 new, with
# MERGE_BLOCK 64 2.3760 against 2.3904 for 64 and 16. Twice the partials cost at many lanes: 9B 32 streams
# 6.8459 against 6.7356, 35B-A3B 14.0274 against 13.9438.
SHORT_SEGMENT = 32
SHORT_KEYS = 4096
STATS = 4  # partials' columns after head_dim: running max, sum of exp, two pads keeping 16-byte rows
# Segments the merge loads at once: 64 merges 2,048 keys in one block (35B-A3B one stream 2.3760 ms against
# 2.3868 at 32; 9B 32 streams 6.8420 against 6.8472).
MERGE_BLOCK = 64
# The segments' launch reads the lanes' lengths and its first block's page-table entries before its
# dependent-launch wait, the merge its lengths and the output gate: none is written by the launch
# before (decode's callers write lengths and page tables at the step's start), so they come while it
# ends. After the wait a segment asks for q and its first keys at once, the merge for its first
# block's maxima, sums and rows at once. Not yet measured; the same bits.
LOADS_FIRST = True
# Warps of a decode segment's program. 4 were timed best at 64 lanes x 8K keys; at head_dim 256 the program
# takes 255 registers and 16 bytes of stack (sm_90, offline), with 8 223 and none, and no faster at one
# lane (35B-A3B 2.4383 against 2.4381 ms). Every row count takes the same, so a lane's bits never depend on
# its batch; they do follow this.
DECODE_WARPS = 4
LOG2E = math.log2(math.e)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _key_block(head_dim: int, segment: int) -> int:
    """Keys a K/V tile holds: ~8K elements a tile, at most 64, dividing the segment."""
    return min(64, max(16, 8192 // head_dim), segment)


def _decode_config(head_dim: int, segment: int) -> dict[str, int]:
    """Tile and launch sizes of a decode segment; best of those timed on an H200 at 64 lanes x 8K keys."""
    return {"BLOCK_N": _key_block(head_dim, segment), "num_warps": DECODE_WARPS, "num_stages": 2}


@triton.jit
def _dot(a, b, acc, WIDEN: tl.constexpr):
    if WIDEN:  # the interpreter multiplies bf16 as raw integers; fp32 holds bf16 products exactly
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision="ieee")


@triton.jit
def attend_block(query, k_cache, v_cache, pages, slots, valid, seen, kv_head, dims, scale_log2, m_i, l_i, acc,
                 stride_kp, stride_ks, stride_kh, stride_kd, stride_vp, stride_vs, stride_vh, stride_vd,
                 WIDEN: tl.constexpr):
    """One block of keys (at ``pages``/``slots``, ``valid`` ones loaded) into the query rows' running
    softmax, each row scoring only the keys ``seen`` [rows, keys] marks: the new running max, sum of
    exp and fp32 P @ V. A row whose running max is finite and sees none of the block rescales by
    exactly 1 and adds exact zeros."""
    k_rows = pages.to(tl.int64) * stride_kp + slots * stride_ks + kv_head * stride_kh  # pools pass 2**31
    v_rows = pages.to(tl.int64) * stride_vp + slots * stride_vs + kv_head * stride_vh
    k = tl.load(k_cache + k_rows[:, None] + dims[None, :] * stride_kd, mask=valid[:, None], other=0.0)
    scores = _dot(query, tl.trans(k), None, WIDEN) * scale_log2
    scores = tl.where(seen, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(scores - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_cache + v_rows[:, None] + dims[None, :] * stride_vd, mask=valid[:, None], other=0.0)
    return m_new, l_i, _dot(p.to(v.dtype), v, acc * alpha[:, None], WIDEN)


@triton.jit
def _segment_keys(segment, length, SHORT: tl.constexpr, SHORT_KEYS: tl.constexpr, SEG: tl.constexpr):
    """Segment ``segment``'s first key and its end within ``length`` keys."""
    if segment < SHORT_KEYS // SHORT:
        first = segment * SHORT
        end = first + SHORT
    else:
        first = SHORT_KEYS + (segment - SHORT_KEYS // SHORT) * SEG
        end = first + SEG
    return first, tl.minimum(end, length)


@triton.jit
def _segment_count(length, SHORT: tl.constexpr, SHORT_KEYS: tl.constexpr, SEG: tl.constexpr):
    """Segments that ``length`` keys span."""
    return tl.where(length <= SHORT_KEYS, tl.cdiv(length, SHORT),
                    SHORT_KEYS // SHORT + tl.cdiv(length - SHORT_KEYS, SEG))


def segments_for(max_keys: int, segment: int = SEGMENT) -> int:
    """Decode segments of a lane of ``max_keys`` keys: ``SHORT_KEYS`` in short ones, then ``segment``
    at a time (a segment below ``SHORT_SEGMENT`` is short everywhere)."""
    short = min(SHORT_SEGMENT, segment)
    if max_keys <= SHORT_KEYS:
        return -(-max_keys // short)  # ceiling divisions in ints (triton.cdiv is untyped)
    return SHORT_KEYS // short - (-(max_keys - SHORT_KEYS) // segment)


@triton.jit
def _page_entries(page_table, lane, keys, mask, stride_tb, stride_tp, PAGE_ROWS: tl.constexpr):
    """The page-table entries of a lane's ``keys`` (0 where not ``mask``)."""
    return tl.load(page_table + lane * stride_tb + (keys // PAGE_ROWS) * stride_tp, mask=mask, other=0)


@triton.jit
def _sums_rows(base, segs, live, dims, stride_ps, HEAD_DIM: tl.constexpr):
    """A block of a head's segments' sums of exp and P @ V rows (zeros where not ``live``)."""
    sums = tl.load(base + segs * stride_ps + HEAD_DIM + 1, mask=live, other=0.0)
    return sums, tl.load(base + segs[:, None] * stride_ps + dims[None, :], mask=live[:, None], other=0.0)


@triton.jit
def store_partial(rows, acc, m_i, l_i, dims, live, HEAD_DIM: tl.constexpr):
    """A segment's partial for its ``live`` heads at ``rows`` (a head's row each): P @ V, then the
    running max and the sum of exp after it, as ``_decode_merge`` reads them."""
    tl.store(rows[:, None] + dims[None, :], acc, mask=live[:, None])
    tl.store(rows + HEAD_DIM, m_i, mask=live)
    tl.store(rows + HEAD_DIM + 1, l_i, mask=live)


@triton.jit
def _decode_segment(q, k_cache, v_cache, page_table, lengths, partials, scale_log2, max_keys,
                    stride_qb, stride_qh, stride_qd, stride_kp, stride_ks, stride_kh, stride_kd,
                    stride_vp, stride_vs, stride_vh, stride_vd, stride_tb, stride_tp,
                    stride_pb, stride_ps, stride_ph,
                    PAGE_ROWS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                    HEAD_DIM: tl.constexpr, SHORT: tl.constexpr, SHORT_KEYS: tl.constexpr, SEG: tl.constexpr,
                    BLOCK_N: tl.constexpr, WIDEN: tl.constexpr, FIRST: tl.constexpr, PDL: tl.constexpr):
    lane = tl.program_id(0)
    kv_head = tl.program_id(1)
    segment = tl.program_id(2)
    if FIRST:  # the step's lengths and page table, written launches ago, read while the kernel before ends
        length = tl.minimum(tl.load(lengths + lane), max_keys)
        first, end = _segment_keys(segment, length, SHORT, SHORT_KEYS, SEG)
        keys = first + tl.arange(0, BLOCK_N)
        first_pages = _page_entries(page_table, lane, keys, keys < end, stride_tb, stride_tp, PAGE_ROWS)
        pdl.wait(PDL)
    else:
        pdl.wait(PDL)
        length = tl.minimum(tl.load(lengths + lane), max_keys)
        first, end = _segment_keys(segment, length, SHORT, SHORT_KEYS, SEG)
        first_pages = tl.zeros((BLOCK_N,), tl.int32)  # unread: each block loads its own
    if first >= length:  # the grid covers the widest lane; this segment is past this one's keys
        return
    members = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + members
    query = tl.load(q + lane * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
                    mask=(members < GROUP)[:, None], other=0.0)
    m_i = tl.full((GROUP_PAD,), float("-inf"), tl.float32)
    l_i = tl.zeros((GROUP_PAD,), tl.float32)
    acc = tl.zeros((GROUP_PAD, HEAD_DIM), tl.float32)
    for start in range(first, end, BLOCK_N):  # the segment's first block has a key: m_i turns finite
        keys = start + tl.arange(0, BLOCK_N)
        valid = keys < end
        pages = first_pages
        if FIRST:
            if start != first:
                pages = _page_entries(page_table, lane, keys, valid, stride_tb, stride_tp, PAGE_ROWS)
        else:
            pages = _page_entries(page_table, lane, keys, valid, stride_tb, stride_tp, PAGE_ROWS)
        m_i, l_i, acc = attend_block(query, k_cache, v_cache, pages, keys % PAGE_ROWS, valid,
                                     valid[None, :], kv_head, dims, scale_log2, m_i, l_i, acc,
                                     stride_kp, stride_ks, stride_kh, stride_kd,
                                     stride_vp, stride_vs, stride_vh, stride_vd, WIDEN)
    store_partial(partials + lane * stride_pb + segment * stride_ps + heads * stride_ph, acc, m_i, l_i, dims,
                  members < GROUP, HEAD_DIM)


@triton.jit
def _decode_merge(partials, lengths, out, gate, q, scales, max_keys, stride_pb, stride_ps, stride_ph,
                  stride_ob, stride_oh, stride_od, stride_gb, stride_gh, stride_q, stride_s,
                  HEAD_DIM: tl.constexpr, SHORT: tl.constexpr, SHORT_KEYS: tl.constexpr, SEG: tl.constexpr,
                  BLOCK_S: tl.constexpr, GATED: tl.constexpr, FIRST: tl.constexpr, QUANTIZE: tl.constexpr,
                  EXACT_CAST: tl.constexpr, PDL: tl.constexpr):
    lane = tl.program_id(0)
    head = tl.program_id(1)
    dims = tl.arange(0, HEAD_DIM)
    if FIRST:  # the lengths and the gate are no input of the segments' launch: read before its end
        count = _segment_count(tl.minimum(tl.load(lengths + lane), max_keys), SHORT, SHORT_KEYS, SEG)
        if GATED:
            gates = tl.load(gate + lane * stride_gb + head * stride_gh + dims)
        pdl.wait(PDL)
    else:
        pdl.wait(PDL)
        count = _segment_count(tl.minimum(tl.load(lengths + lane), max_keys), SHORT, SHORT_KEYS, SEG)
    base = partials + lane * stride_pb + head * stride_ph
    blocks = tl.arange(0, BLOCK_S)
    # the first block's maxima, sums and rows asked for at once (with FIRST; else the max's pass first)
    live = blocks < count
    m_first = tl.load(base + blocks * stride_ps + HEAD_DIM, mask=live, other=float("-inf"))
    if FIRST:
        l_first, rows_first = _sums_rows(base, blocks, live, dims, stride_ps, HEAD_DIM)
    top = m_first
    for first in range(BLOCK_S, count, BLOCK_S):  # max is exact, so its order is free
        segs = first + blocks
        top = tl.maximum(top, tl.load(base + segs * stride_ps + HEAD_DIM, mask=segs < count,
                                      other=float("-inf")))
    top_max = tl.where(count > 0, tl.max(top, 0), 0.0)  # a padding lane: no -inf - -inf below
    if not FIRST:
        l_first, rows_first = _sums_rows(base, blocks, live, dims, stride_ps, HEAD_DIM)
    # slot j sums segments j, j + BLOCK_S, ... in that order, from zeros
    weight = tl.where(live, tl.exp2(m_first - top_max), 0.0)
    total = tl.zeros((BLOCK_S,), tl.float32) + weight * l_first
    acc = tl.zeros((BLOCK_S, HEAD_DIM), tl.float32) + weight[:, None] * rows_first
    for first in range(BLOCK_S, count, BLOCK_S):
        segs = first + blocks
        live = segs < count
        m_s = tl.load(base + segs * stride_ps + HEAD_DIM, mask=live, other=float("-inf"))
        weight = tl.where(live, tl.exp2(m_s - top_max), 0.0)
        sums, rows = _sums_rows(base, segs, live, dims, stride_ps, HEAD_DIM)
        total += weight * sums
        acc += weight[:, None] * rows
    denominator = tl.sum(total, 0)
    dtype = out.dtype.element_ty
    result = (tl.sum(acc, 0) / tl.where(denominator > 0, denominator, 1.0)).to(dtype)
    if GATED:  # attention's output gate, rounded as tfd_kernels.sigmoid_gate rounds it
        if not FIRST:
            gates = tl.load(gate + lane * stride_gb + head * stride_gh + dims)
        result = gated(result, gates, dtype)
    tl.store(out + lane * stride_ob + head * stride_oh + dims * stride_od, result)  # padding lanes: zeros
    if QUANTIZE:  # the lane's row of heads, quantized for the FP8 out projection: a head is whole groups
        groups: tl.constexpr = HEAD_DIM // 128
        fp8_rows.store_groups(result.to(tl.float32), dims < HEAD_DIM, q, scales,
                              lane * stride_q + head * HEAD_DIM + dims, lane * stride_s + head * groups,
                              groups, EXACT_CAST)


def checked_group(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                  out: torch.Tensor, vectors: dict[str, tuple[torch.Tensor, int]]) -> int:
    """The GQA group size of a paged attention call (decode's or prefill's): raise ValueError naming
    the argument at fault, ``vectors`` mapping each int32 vector's name to it and its length."""
    if q.dim() != 3 or q.dtype not in DTYPES:
        raise ValueError(f"q must be [rows, heads, head_dim] of bf16/fp16/fp32, got {list(q.shape)} "
                         f"{q.dtype}")
    heads, head_dim = q.shape[1], q.shape[2]
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"q's head_dim must be a power of two of at least 16, got {head_dim}")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if (cache.dim() != 4 or cache.shape[3] != head_dim or cache.shape[2] == 0
                or heads % cache.shape[2] or cache.dtype != q.dtype or cache.shape != k_cache.shape):
            raise ValueError(f"{name} must be [pages + 1, page_rows, kv_heads, {head_dim}] of {q.dtype} with "
                             f"kv_heads dividing {heads} (and match k_cache), got {list(cache.shape)} "
                             f"{cache.dtype}")
    if page_table.dim() != 2 or page_table.dtype != torch.int32 or page_table.shape[1] == 0:
        raise ValueError(f"page_table must be int32 [lanes, max_pages], got {list(page_table.shape)} "
                         f"{page_table.dtype}")
    if out.shape != q.shape or out.dtype != q.dtype:
        raise ValueError(f"out must be {list(q.shape)} {q.dtype}, got {list(out.shape)} {out.dtype}")
    for name, (vector, size) in vectors.items():
        if vector.shape != (size,) or vector.dtype != torch.int32 or not vector.is_contiguous():
            raise ValueError(f"{name} must be a contiguous int32 [{size}], got {list(vector.shape)} "
                             f"{vector.dtype}")
    named = {"k_cache": k_cache, "v_cache": v_cache, "page_table": page_table, "out": out}
    named.update({name: vector for name, (vector, _) in vectors.items()})
    for name, tensor in named.items():
        if tensor.device != q.device:
            raise ValueError(f"{name} is on {tensor.device}, q on {q.device}")
    return heads // k_cache.shape[2]


def cache_strides(k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor) -> list[int]:
    """The strides of the caches and the page table, in the order the kernels take them."""
    return [*k_cache.stride(), *v_cache.stride(), *page_table.stride()]


def partials_for(lanes: int, heads: int, head_dim: int, max_keys: int, device: torch.device | str, *,
                 segment: int = SEGMENT) -> torch.Tensor:
    """Decode's fp32 scratch for ``lanes`` lanes of at most ``max_keys`` keys (pages x page_rows)."""
    return torch.empty(lanes, segments_for(max_keys, segment), heads, head_dim + STATS,
                       dtype=torch.float32, device=device)


def decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
           lengths: torch.Tensor, scale: float, out: torch.Tensor, partials: torch.Tensor, *,
           segment: int = SEGMENT, gate: torch.Tensor | None = None,
           rows: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Attention of ``q`` [lanes, heads, head_dim] over each lane's first ``lengths[lane]`` keys, into
    ``out``; a lane of length 0 gets zeros. ``partials`` comes from ``partials_for``. With ``gate``
    (like q, unit last stride: attention's output gate), ``out`` is the gated output, the bits of
    ``tfd_kernels.sigmoid_gate`` on the plain one. With ``rows`` (``fp8_rows.empty_rows`` of [lanes,
    heads * head_dim]; ``quantizes``), ``out``'s rows quantized there too, as ``fp8_gemm.quantize``
    would. Returns ``out``."""
    if gate is not None and (gate.shape != q.shape or gate.stride(2) != 1 or gate.dtype != out.dtype):
        raise ValueError(f"gate is {list(gate.shape)} {gate.dtype}: want q's shape {list(q.shape)} in "
                         f"{out.dtype}, unit last stride")
    lanes = q.shape[0] if q.dim() == 3 else -1
    group = checked_group(q, k_cache, v_cache, page_table, out, {"lengths": (lengths, lanes)})
    heads, head_dim = q.shape[1], q.shape[2]
    if page_table.shape[0] != lanes:
        raise ValueError(f"page_table has {page_table.shape[0]} lanes, q {lanes}")
    if segment < 16 or segment & (segment - 1):
        raise ValueError(f"segment must be a power of two of at least 16, got {segment}")
    max_keys = page_table.shape[1] * k_cache.shape[1]
    segments = segments_for(max_keys, segment)
    short = min(SHORT_SEGMENT, segment)
    if (partials.dim() != 4 or partials.dtype != torch.float32 or partials.shape[0] != lanes
            or partials.shape[1] < segments or partials.shape[2:] != (heads, head_dim + STATS)
            or partials.stride(3) != 1 or partials.device != q.device):
        raise ValueError(f"partials must be fp32 [{lanes}, >= {segments}, {heads}, {head_dim + STATS}] on "
                         f"{q.device} (see partials_for), got {list(partials.shape)} {partials.dtype}")
    kv_heads = k_cache.shape[2]
    group_pad = max(16, triton.next_power_of_2(group))  # tl.dot needs M >= 16
    _decode_segment[(lanes, kv_heads, segments)](
        q, k_cache, v_cache, page_table, lengths, partials, scale * LOG2E, max_keys,
        *q.stride(), *cache_strides(k_cache, v_cache, page_table), *partials.stride()[:3],
        PAGE_ROWS=k_cache.shape[1], GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim, SHORT=short,
        SHORT_KEYS=SHORT_KEYS, SEG=segment, WIDEN=INTERPRETED, FIRST=LOADS_FIRST,
        **_decode_config(head_dim, short), **pdl.options(q.device))
    gates = out if gate is None else gate  # not read without GATED
    if rows is not None and not quantizes(head_dim):
        raise ValueError(f"rows: heads of {head_dim} are not whole 128-wide groups")
    codes, scales = fp8_rows.targets(rows, lanes, heads * head_dim, out)
    _decode_merge[(lanes, heads)](partials, lengths, out, gates, codes, scales, max_keys,
                                  *partials.stride()[:3], *out.stride(), gates.stride(0), gates.stride(1),
                                  codes.stride(0), scales.stride(0), HEAD_DIM=head_dim, SHORT=short,
                                  SHORT_KEYS=SHORT_KEYS, SEG=segment, BLOCK_S=MERGE_BLOCK,
                                  GATED=gate is not None, FIRST=LOADS_FIRST, QUANTIZE=rows is not None,
                                  EXACT_CAST=INTERPRETED, num_warps=4,
                                  **pdl.options(out.device))
    return out


def quantizes(head_dim: int) -> bool:
    """Whether ``decode`` can write its output quantized too: each head whole 128-wide groups."""
    return head_dim % 128 == 0


def attend_rows(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, last: torch.Tensor,
                scale: float) -> torch.Tensor:
    """Rows ``query`` [r, heads, d] over ``keys``/``values`` [n, kv_heads, d], row i seeing keys
    0..last[i]; fp32 throughout, cast to q's dtype."""
    kv_heads, d = keys.shape[1], keys.shape[2]
    grouped = query.float().view(query.shape[0], kv_heads, -1, d)
    scores = torch.einsum("rkgd,nkd->rkgn", grouped, keys.float()) * scale
    hidden = torch.arange(keys.shape[0], device=keys.device)[None, :] > last[:, None]
    weights = torch.softmax(scores.masked_fill(hidden[:, None, None, :], float("-inf")), dim=-1)
    return torch.einsum("rkgn,nkd->rkgd", weights, values.float()).reshape(query.shape).to(query.dtype)


def gathered(cache: torch.Tensor, table: torch.Tensor, count: int) -> torch.Tensor:
    """A lane's first ``count`` rows of ``cache``, in position order through its page-table row."""
    positions = torch.arange(count, device=cache.device)
    return cache[table[positions // cache.shape[1]].long(), positions % cache.shape[1]]


def reference_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                     lengths: torch.Tensor, scale: float, out: torch.Tensor,
                     partials: torch.Tensor | None = None) -> torch.Tensor:
    """``decode`` by torch, gathering rows through the page table (``partials`` unused)."""
    for lane, length in enumerate(lengths.tolist()):
        if length == 0:
            out[lane] = 0
            continue
        table = page_table[lane]
        keys, values = gathered(k_cache, table, length), gathered(v_cache, table, length)
        last = torch.tensor([length - 1], device=q.device)
        out[lane] = attend_rows(q[lane:lane + 1], keys, values, last, scale)[0]
    return out

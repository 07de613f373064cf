"""Gated attention through the pool's pages (reference/model.md 2.5), dense or QSA-selected.

Every query row attends its own key set (all earlier positions, or QSA's selection) with
products of fixed shape, so a row's output is the same however many rows share the call. Keys and
values are written to the lane's rows first, then read back by position.
"""

from __future__ import annotations

import attrs
import torch

from tfd.model import ops
from tfd.model.fp8 import Weight
from tfd.model.memory import LanesOnce, PageRows, PromptLanes, Span, ints_on
from tfd.model.ops import Input, linear, sigmoid_gate, values_of, zrms
from tfd.model.qsa import DecodeRows, IndexerWeights, select_positions, select_rows, whole_prefix
from tfd.model.rope import Rotary
from tfd_kernels import cache_write, paged_attention, paged_prefill, sparse_attention
from tfd_kernels import rope as rope_kernel

# At decode, the output projection's first K step of weights asked for before it waits for the merge of
# the attention's segments, a kernel of few reads (tfd_kernels.gemm.EARLY_STEPS). H200, 35B-A3B one stream,
# best of three: 2.4099 ms against 2.4106, with the short segments 2.3979 against 2.3993. At every
# layer's out projection at once (GDN's too, which follow the rule's state traffic) it had lost.
OUT_EARLY = True
# A QSA prompt's rows before the indexer's whole prefix (qsa.whole_prefix: their choice is every position up
# to theirs) attend on CUDA as dense rows do (tfd_kernels.paged_prefill, in tiles of rows), where one program
# a row and kv head walked each row's positions (Flash Next's 1,024-row prefill on the H200: 320 us a QSA
# layer). Other bits than the sparse kernel's for those rows, the same wherever the prompt is cut (a row's
# kernel follows its position alone). H100, Flash Next 1 x 1,024, 8 of 48 layers, tfd bench --variant (best
# of two): prefill 26.2 ms against 26.7, 33.2 against 34.9, the same tokens; the device path's Flash Next GPU
# tests passed with it (docs/bench.md, forty-fifth session).
DENSE_PREFIX = True


@attrs.frozen
class AttentionWeights:
    qkv: Weight  # [heads * 2 * head_dim + 2 * kv_heads * head_dim, hidden]: q (per head
    # [query | gate]), then k, then v: one product for the three
    o: Weight  # [hidden, heads * head_dim]
    q_norm: torch.Tensor  # [head_dim], zero-centred
    k_norm: torch.Tensor
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    indexer: IndexerWeights | None = None


@attrs.frozen
class QsaCaches:
    """A QSA layer's row parts as ``[pages + 1, entries a page, ...]`` views of the pool: K, V, raw
    index keys, pooled blocks."""

    keys: torch.Tensor
    values: torch.Tensor
    index: torch.Tensor
    pooled: torch.Tensor


@attrs.frozen
class Projected:
    """Rows' rotated queries [rows, heads, d], output gates [rows, heads, d] (views of the
    projection), keys and values."""

    query: torch.Tensor
    gate: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor


def project(w: AttentionWeights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            rotary: Rotary) -> Projected:
    query, gate, key, value = _split(w, x)
    if x.is_cuda:  # norm and rotation of q and k in one kernel
        query, key = rope_kernel.norm_rope_pair(query, w.q_norm, key, w.k_norm, cos, sin, w.eps)
    else:
        query = rotary.apply(zrms(query, w.q_norm, w.eps), cos, sin)
        key = rotary.apply(zrms(key, w.k_norm, w.eps), cos, sin)
    return Projected(query, gate, key, value)


def _split(w: AttentionWeights, x: Input) -> tuple[torch.Tensor, ...]:
    """The projection of ``x`` as views: raw queries, gates, raw keys [rows, heads, d], values."""
    count, d = values_of(x).shape[0], w.head_dim
    both = linear(x, w.qkv, early=True)  # at decode it follows the MoE block, whose end reads little
    query_gate, key, value = torch.split(both, [w.heads * 2 * d, w.kv_heads * d, w.kv_heads * d], dim=-1)
    query_gate = query_gate.view(count, w.heads, 2 * d)
    return (query_gate[..., :d], query_gate[..., d:], key.view(count, w.kv_heads, d),
            value.reshape(count, w.kv_heads, d))


def finish(w: AttentionWeights, out: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """The gated heads [rows, heads, d] through the output projection."""
    return linear(sigmoid_gate(out.reshape(out.shape[0], -1), gate), w.o)


def attention_rows(w: AttentionWeights, x: Input, cos: torch.Tensor, sin: torch.Tensor,
                   rotary: Rotary, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                   lengths: torch.Tensor) -> torch.Tensor:
    """One decode row per lane, batched: ``x`` [lanes, hidden] at positions ``lengths - 1``
    (``cos``/``sin`` their angles). Stores each row's K and V through ``page_table`` [lanes,
    pages] (int32) into the layer's caches, then attends the lane's first ``lengths`` rows; a
    padding lane (length 0) stores nothing. Triton kernels on CUDA, torch references elsewhere. ``x`` may
    come with its FP8 form (``Fp8Rows``): an FP8 projection's."""
    if values_of(x).is_cuda:  # q normed and rotated, k too, stored with v, in one launch; the merge gates
        query, gate, key, value = _split(w, x)
        query = rope_kernel.norm_rope_store(query, w.q_norm, key, w.k_norm, value, cos, sin, w.eps, k_cache,
                                            v_cache, page_table, lengths)
        out = torch.empty_like(query)
        count = query.shape[0]
        partials = paged_attention.partials_for(count, w.heads, w.head_dim,
                                                page_table.shape[1] * k_cache.shape[1], query.device)
        # the merge writes its rows quantized too where the out projection is FP8
        room = ops.fp8_room(query, w.heads * w.head_dim, w.o, paged_attention.quantizes(w.head_dim))
        paged_attention.decode(query, k_cache, v_cache, page_table, lengths, w.head_dim ** -0.5, out,
                               partials, gate=gate, rows=room)
        rows = out.reshape(count, -1)
        return linear(rows if room is None else ops.Fp8Rows(rows, *room), w.o, early=OUT_EARLY)
    p = project(w, values_of(x), cos, sin, rotary)
    cache_write.reference(p.key, p.value, k_cache, v_cache, page_table, lengths)
    out = torch.empty_like(p.query)
    paged_attention.reference_decode(p.query, k_cache, v_cache, page_table, lengths, w.head_dim ** -0.5, out,
                                     None)
    return finish(w, out, p.gate)


def attention_spans(w: AttentionWeights, x: torch.Tensor, lanes: PromptLanes | LanesOnce, keys: torch.Tensor,
                    values: torch.Tensor, rotary: Rotary) -> torch.Tensor:
    """The layer's output for the prompt rows ``x`` [rows, hidden] of every lane of ``lanes`` at
    once (dense attention, the Triton kernel): one product, one K/V store into the layer's caches
    ``keys``/``values`` [pages + 1, page rows, kv_heads, d], one causal attention launch through the
    lanes' page tables. Each lane's rows get the bits they get alone."""
    made = lanes.get()
    cos, sin = rotary.angles(made.positions, x.dtype)
    p = project(w, x, cos, sin, rotary)
    keys[made.pages, made.slots] = p.key.to(keys.dtype)
    values[made.pages, made.slots] = p.value.to(values.dtype)
    out = torch.empty_like(p.query)
    paged_prefill.prefill(p.query, keys, values, made.page_table, made.starts, made.cu_seqlens,
                          w.head_dim ** -0.5, out, max_rows=made.max_rows)
    return finish(w, out, p.gate)


def sparse_rows(w: AttentionWeights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: Rotary,
                caches: QsaCaches, page_table: torch.Tensor, lengths: torch.Tensor, rows: DecodeRows,
                tables: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """``attention_rows`` for a QSA layer: one decode row per lane, batched, at positions
    ``lengths - 1`` (``lengths`` int32 [lanes], 0 for a padding lane; ``rows`` the same as every QSA
    layer of the step reads them, ``qsa.decode_rows``; ``page_table`` int32 [lanes, pages]). Stores
    each live row's K and V, its raw index key and the block it completes in
    ``caches`` (``qsa.select_rows``; ``tables``: every position's angles, on CUDA), then attends each
    row's chosen positions (``tfd_kernels.sparse_attention``: the kernel on CUDA, with its
    ``DECODE_SEGMENTS`` in decode's segments, gated in their merge; its reference elsewhere), as
    ``attention`` does for a span's rows (whole: other bits than a segmented decode row's). A padding
    lane stores nothing and reads the null page."""
    assert w.indexer is not None
    p = project(w, x, cos, sin, rotary)
    write = cache_write.write if x.is_cuda else cache_write.reference
    write(p.key, p.value, caches.keys, caches.values, page_table, lengths)
    chosen_at, counts = select_rows(w.indexer, x, rotary, cos, sin, caches.index, caches.pooled, page_table,
                                    rows, tables)
    out = torch.empty_like(p.query)
    if x.is_cuda and sparse_attention.DECODE_SEGMENTS:  # a step's and a verify window's rows; the merge gates
        sparse_attention.attend(p.query, caches.keys, caches.values, page_table, rows.lane_of, chosen_at,
                                counts, w.head_dim ** -0.5, out, split=True, gate=p.gate)
        return linear(out.reshape(out.shape[0], -1), w.o)
    attend_chosen = sparse_attention.attend if x.is_cuda else sparse_attention.reference
    attend_chosen(p.query, caches.keys, caches.values, page_table, rows.lane_of, chosen_at, counts,
                  w.head_dim ** -0.5, out)
    return finish(w, out, p.gate)


def attention(w: AttentionWeights, x: torch.Tensor, span: Span, rows: PageRows, layer: str,
              rotary: Rotary) -> torch.Tensor:
    """The layer's output for ``span``'s rows ``x`` [rows, hidden]; stores their K and V (and for
    QSA the index keys and the blocks the rows complete)."""
    count, d = x.shape[0], w.head_dim
    positions = torch.arange(span.start, span.end, device=x.device)
    cos, sin = rotary.angles(positions, x.dtype)
    p = project(w, x, cos, sin, rotary)
    query, key, value = p.query, p.key, p.value
    rows.write(f"{layer}.k", span.lane, positions, key)
    rows.write(f"{layer}.v", span.lane, positions, value)
    if x.is_cuda and w.indexer is None:  # the rows attend in place through the page table
        out = torch.empty_like(query)
        _causal(query, rows.views[f"{layer}.k"], rows.views[f"{layer}.v"], span, out)
        return finish(w, out, p.gate)
    if w.indexer is not None:  # QSA: each row over its chosen positions, read in place (CUDA) or gathered
        # on CUDA the rows whose choice is every position up to theirs may attend as dense rows (DENSE_PREFIX)
        dense = min(count, max(0, whole_prefix(w.indexer) - span.start)) if x.is_cuda and DENSE_PREFIX else 0
        chosen_at, counts = select_positions(w.indexer, x, span, rows, layer, rotary, cos, sin, dense)
        out = torch.empty_like(query)
        k_cache, v_cache = rows.views[f"{layer}.k"], rows.views[f"{layer}.v"]
        if dense:
            _causal(query[:dense], k_cache, v_cache, span, out[:dense])
        if dense < count:
            lane_of = torch.zeros(count - dense, dtype=torch.int32, device=x.device)
            attend_chosen = sparse_attention.attend if x.is_cuda else sparse_attention.reference
            attend_chosen(query[dense:], k_cache, v_cache, span.lane.page_table[None], lane_of, chosen_at,
                          counts, d ** -0.5, out[dense:])
        return finish(w, out, p.gate)
    keys = rows.read(f"{layer}.k", span.lane, span.end)
    values = rows.read(f"{layer}.v", span.lane, span.end)
    out = torch.empty(count, w.heads, d, dtype=x.dtype, device=x.device)
    for row in range(count):
        visible = span.start + row + 1
        out[row] = attend(query[row], keys[:visible], values[:visible], d ** -0.5)
    return finish(w, out, p.gate)


def _causal(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, span: Span, out: torch.Tensor
            ) -> None:
    """``query``'s rows (the first of ``span``'s, from its start) over every key up to each one's position,
    through the lane's page table, into ``out`` (``tfd_kernels.paged_prefill``, one lane). Its bounds each
    from the ring, so 16-byte aligned (a kernel compiles once for either)."""
    rows = query.shape[0]
    starts = ints_on([span.start], query.device, torch.int32)
    bounds = ints_on([0, rows], query.device, torch.int32)
    paged_prefill.prefill(query, k_cache, v_cache, span.lane.page_table[None], starts, bounds,
                          query.shape[-1] ** -0.5, out, max_rows=rows)


def attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """Softmax attention of one row's ``query`` [heads, d] over ``keys``/``values`` [n, kv_heads, d].

    Query head h reads kv head h // (heads / kv_heads); the softmax runs in fp32.
    """
    kv_heads = keys.shape[1]
    grouped = query.view(kv_heads, -1, query.shape[-1])
    scores = (grouped @ keys.permute(1, 2, 0)) * scale
    weights = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    return (weights @ values.transpose(0, 1)).reshape(query.shape)

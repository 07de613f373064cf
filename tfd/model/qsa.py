"""Qwen Sparse Attention's indexer (reference/model.md 3.4): which positions a query attends.

Raw index keys are kept per position, before norm and RoPE. When a block of ``block`` positions
completes, its pooled key (mean of the raw keys in fp32, cast back, normed, rotated at the block's
first position) is kept too; completed blocks never change. A query at position p scores every
complete block: sum over index heads of relu(q_h . K_b) / sqrt(dim) in fp32, takes the best
``budget / block`` (ties to the lower block), and adds the incomplete tail up to p.

``select_positions`` chooses for a lane's rows (the span path), ``select_rows`` for one row of each
lane of a batched decode step. Both score with ``tfd_kernels.block_scores`` and choose with ``choose``
(on CUDA with ``tfd_kernels.block_choice``: the same positions in one launch, its rows' width the
budget's whatever the blocks, -1 past each row's count), so a row's positions are the same by either
path and whatever else is in the call.
"""

from __future__ import annotations

import attrs
import torch

from tfd.model.fp8 import Weight
from tfd.model.memory import PageRows, Span
from tfd.model.ops import linear, zrms
from tfd.model.rope import Rotary
from tfd_kernels import block_choice, block_scores, index_pool, lane_rows
from tfd_kernels import rope as rope_kernel

# A span's rows scored and chosen at a time: the scores are rows x complete blocks (fp32) and, off
# CUDA, their sort twice that, so a 32,768-row chunk at 128k tokens of context would hold ~12 GiB.
SCORED_ROWS = 2048


@attrs.frozen
class DecodeRows:
    """A batched decode step's rows as every QSA layer reads them, made once a step (``decode_rows``):
    on a GPU each is a launch, four QSA layers a Flash Next step would make them four times."""

    lengths: torch.Tensor  # int64 [rows]: each row's visible keys, 0 for a padding lane
    positions: torch.Tensor  # int64 [rows]: lengths - 1, 0 for a padding lane
    ends: torch.Tensor  # int64 [rows]: positions + 1, the positions a row's complete blocks end before
    rowed: torch.Tensor  # int64 [rows]: 0, 1, ...: a row is its own lane of the page table
    lane_of: torch.Tensor  # int32 [rows]: the same, as the kernels take it


def decode_rows(lengths: torch.Tensor) -> DecodeRows:
    """``DecodeRows`` of the rows' visible keys ``lengths`` [rows] (any integer dtype)."""
    lengths = lengths.long()
    positions = (lengths - 1).clamp_min(0)
    rowed = torch.arange(lengths.shape[0], device=lengths.device)
    return DecodeRows(lengths, positions, positions + 1, rowed, rowed.to(torch.int32))


@attrs.frozen
class IndexerWeights:
    qk: Weight  # [(heads + 1) * dim, hidden]: the index heads' queries, then one key
    q_norm: torch.Tensor  # [dim], zero-centred
    k_norm: torch.Tensor
    heads: int
    dim: int
    budget: int  # positions chosen from complete blocks at most
    block: int  # positions a pooled block covers
    eps: float


def whole_prefix(w: IndexerWeights) -> int:
    """The positions before which a row's choice is every position up to its own: its complete blocks, at
    most ``budget // block`` of them, all chosen, and the tail after them (``choose``'s rule)."""
    return (w.budget // w.block + 1) * w.block - 1


def index_rows(w: IndexerWeights, x: torch.Tensor, rotary: Rotary, cos: torch.Tensor, sin: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' index queries [rows, heads, dim] (normed, rotated) and raw index keys [rows, dim]."""
    rows = x.shape[0]
    projected = linear(x, w.qk)
    query = projected[:, :w.heads * w.dim].view(rows, w.heads, w.dim)
    return _norm_rope(query, w.q_norm, w.eps, rotary, cos, sin), projected[:, w.heads * w.dim:]


def _norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, rotary: Rotary, cos: torch.Tensor,
               sin: torch.Tensor) -> torch.Tensor:
    """RoPE(zrms(x)) per head of ``x`` [rows, heads, dim]: on CUDA one launch with the same cast
    points (``tfd_kernels.rope.norm_rope``, attention's), elsewhere torch's."""
    if x.is_cuda:
        return rope_kernel.norm_rope(x, weight, cos, sin, eps)
    return rotary.apply(zrms(x, weight, eps), cos, sin)


def pool_blocks(w: IndexerWeights, raw: torch.Tensor, starts: torch.Tensor, rotary: Rotary) -> torch.Tensor:
    """Pooled keys [blocks, dim] of raw keys [blocks, block, dim] whose first positions are ``starts``:
    the fp32 mean (added in position order), cast back, normed, rotated at the first position."""
    total = raw[:, 0].float()
    for at in range(1, w.block):
        total = total + raw[:, at].float()
    mean = (total / w.block).to(raw.dtype)
    cos, sin = rotary.angles(starts, raw.dtype)
    return _norm_rope(mean[:, None, :], w.k_norm, w.eps, rotary, cos, sin)[:, 0]


def scores(query: torch.Tensor, pooled: torch.Tensor, page_table: torch.Tensor, lane_of: torch.Tensor,
           complete: torch.Tensor, blocks: int) -> torch.Tensor:
    """``tfd_kernels.block_scores`` on CUDA, its reference elsewhere."""
    score = block_scores.scores if query.is_cuda else block_scores.reference
    return score(query, pooled, page_table, lane_of, complete, blocks)


def choose(w: IndexerWeights, scored: torch.Tensor, positions: torch.Tensor, never: int
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's positions from its block scores [rows, blocks] (-inf past its complete blocks) at
    ``positions`` [rows]: int32 [rows, width] (ascending, then -1) and counts int32 [rows]. A stable
    sort keeps the lower block first among equal scores; ``never`` is past every position."""
    device = scored.device
    complete = (positions + 1) // w.block
    best = torch.sort(scored, dim=-1, descending=True, stable=True).indices[:, :w.budget // w.block]
    picked = (best[:, :, None] * w.block + torch.arange(w.block, device=device)).flatten(1)
    counted = (best < complete[:, None])[:, :, None].expand(-1, -1, w.block).flatten(1)
    picked = torch.where(counted, picked, never)
    tail = complete[:, None] * w.block + torch.arange(w.block - 1, device=device)
    tail = torch.where(tail <= positions[:, None], tail, never)
    ordered = torch.sort(torch.cat((picked, tail), dim=1), dim=1).values
    counts = (ordered < never).sum(dim=1)
    return torch.where(ordered < never, ordered, -1).to(torch.int32), counts.to(torch.int32)


def select_positions(w: IndexerWeights, x: torch.Tensor, span: Span, rows: PageRows, layer: str,
                     rotary: Rotary, cos: torch.Tensor, sin: torch.Tensor, from_row: int = 0
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions each row of ``span`` from its ``from_row`` attends, as ``tfd_kernels.sparse_attention``
    reads them (``choose``), after storing every row's raw index key and the blocks they complete."""
    query, keys = index_rows(w, x, rotary, cos, sin)
    positions = torch.arange(span.start, span.end, device=x.device)
    rows.write(f"{layer}.index", span.lane, positions, keys)
    first, done = span.start // w.block, span.end // w.block
    if done > first:  # blocks this span completes
        raw = rows.read(f"{layer}.index", span.lane, done * w.block)[first * w.block:]
        starts = torch.arange(first, done, device=x.device) * w.block
        pooled = pool_blocks(w, raw.view(done - first, w.block, w.dim), starts, rotary)
        rows.write(f"{layer}.pooled", span.lane, torch.arange(first, done, device=x.device), pooled)
    lane_of = torch.zeros(min(x.shape[0], SCORED_ROWS), dtype=torch.int32, device=x.device)
    chosen, counts = [], []
    for at in range(from_row, x.shape[0], SCORED_ROWS):  # each row's choice its own: slices, the same bits
        part = slice(at, at + SCORED_ROWS)
        scored = scores(query[part], rows.views[f"{layer}.pooled"], span.lane.page_table[None],
                        lane_of[:query[part].shape[0]], (positions[part] + 1) // w.block, done)
        if x.is_cuda:  # one launch for the chunk's rows, where torch sorts [rows, blocks] twice
            found, count = block_choice.choose(scored, positions[part], w.budget // w.block, w.block)
        else:
            found, count = choose(w, scored, positions[part], span.end + w.block)
        chosen.append(found)
        counts.append(count)
    if not chosen:  # every row before whole_prefix: nothing chosen
        width = w.budget // w.block * w.block + w.block - 1  # block_choice.choose's
        return (torch.empty(0, width, dtype=torch.int32, device=x.device),
                torch.empty(0, dtype=torch.int32, device=x.device))
    return torch.cat(chosen), torch.cat(counts)


def select_rows(w: IndexerWeights, x: torch.Tensor, rotary: Rotary, cos: torch.Tensor, sin: torch.Tensor,
                index: torch.Tensor, pooled: torch.Tensor, page_table: torch.Tensor, rows: DecodeRows,
                tables: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``select_positions`` for one decode row a lane, batched: ``x`` [lanes, hidden] at ``rows``'
    positions (``decode_rows``: a padding lane's length 0), ``cos``/``sin`` their angles, the lanes'
    ``page_table`` int32 [lanes, pages] into the layer's ``index`` and ``pooled`` parts.

    Stores each live row's raw index key and, when the row completes a block, the block's pooled
    key; a padding lane stores nothing. On CUDA with ``tables`` (every position's (cos, sin),
    ``DecodeMemory.angle_tables``) that is ``tfd_kernels.index_pool``'s two launches, elsewhere torch
    (``tfd_kernels.lane_rows`` stores). Every lane scores all blocks its page table can hold (-inf past
    its complete ones), so shapes depend on the lane count alone; a padding lane chooses position 0 of
    the null page."""
    query, keys = index_rows(w, x, rotary, cos, sin)
    if x.is_cuda and tables is not None:
        index_pool.store(keys, index, page_table, rows.lengths)
        index_pool.pool(index, pooled, page_table, rows.lengths, w.k_norm, *tables, w.eps, w.block)
    else:
        _store_and_pool(w, keys, rotary, index, pooled, page_table, rows)
    blocks = page_table.shape[1] * pooled.shape[1]
    scored = scores(query, pooled, page_table, rows.lane_of, rows.ends // w.block, blocks)
    if x.is_cuda:  # one launch, the same positions; its row length fixed
        return block_choice.choose(scored, rows.positions, w.budget // w.block, w.block)
    return choose(w, scored, rows.positions, page_table.shape[1] * index.shape[1] + w.block)


def _store_and_pool(w: IndexerWeights, keys: torch.Tensor, rotary: Rotary, index: torch.Tensor,
                    pooled: torch.Tensor, page_table: torch.Tensor, rows: DecodeRows) -> None:
    """``select_rows``' stores by torch: each live row's raw key, then, where its row completes a
    block, the block's pooled key (``pool_blocks``, on every lane's last complete block, kept where
    the row completed it)."""
    device, positions, rowed = keys.device, rows.positions, rows.rowed
    live = rows.lengths > 0
    page_rows, entries = index.shape[1], pooled.shape[1]
    store = lane_rows.store if keys.is_cuda else lane_rows.reference
    pages = page_table[rowed, positions // page_rows].long()
    at = pages * index.stride(0) + (positions % page_rows) * index.stride(1)
    store(keys.contiguous(), index, torch.where(live, at, -1))

    # The last complete block, pooled from the raw keys just stored; kept where this row completed it.
    last = ((positions + 1) // w.block - 1).clamp_min(0)
    members = last[:, None] * w.block + torch.arange(w.block, device=device)
    raw = index[page_table[rowed[:, None], members // page_rows].long(), members % page_rows]
    pooled_keys = pool_blocks(w, raw, last * w.block, rotary)
    completes = live & ((positions + 1) % w.block == 0)
    at = page_table[rowed, last // entries].long() * pooled.stride(0) + (last % entries) * pooled.stride(1)
    store(pooled_keys.contiguous(), pooled, torch.where(completes, at, -1))

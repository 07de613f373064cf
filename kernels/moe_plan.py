"""The plan of an MoE layer's grouped experts (``tfd_kernels.moe``): where each (row, expert) pair goes.

The ``rows * top_k`` routed pairs are grouped by expert on the device with no host sync: per-block
histograms (``_count``), their prefix over blocks (``_scan``) and a stable placement (``_place``)
give each pair its position in expert order; when all pairs fit one block, ``_plan_one`` does it in
one launch, and for up to ``CHOICE_PAIRS`` pairs (decode at a few lanes) ``_route_plan_one`` makes
the router's choice first in that same launch (``tfd_kernels.moe`` makes it in its first launch at one
row, with no plan launch). With a
shared expert every row has one pair more, (row, expert ``experts``): its id is past every routed
one, so those pairs form the last group, one a row in row order from position ``rows * top_k``; the
layout reserves that group and nothing else places it (nor does the one-block bound count it).

Expert kernels find their tile's pairs with ``tile_of`` (from the layout) or, at one row with no
plan launch, ``chosen_tile`` (from the router's logits, every program choosing for itself).

Tables (``Tables``, int32, sized by shapes alone, so a plan can be captured in a CUDA graph):
``layout`` [3, bins] holds each expert's first grouped position, its pairs, and the end of its tiles
(a running sum of ``ceil(pairs / BLOCK_M)``); ``pair_at`` [pairs] the routed pair (row * top_k +
slot) at each grouped position; ``dest_at`` [pairs] that pair's buffer row: row * top_k + its rank
among its row's experts by (id, slot), which depends on its own row alone; ``hist`` [blocks, bins]
the blocks' histograms, then in place their prefixes.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from tfd_kernels import pdl, router

PLAN_BLOCK = 128  # pairs a placement program takes
SCAN_BLOCK = 8  # histogram rows the scan adds at a time
# Pairs the router's choice and the plan take in one launch: its rows choose one after another
# (tfd_kernels.router), so more rows go faster through the router's kernel, a row a program.
CHOICE_PAIRS = 32


@triton.jit(do_not_specialize=["pairs"])  # a step's rows times top-k: one variant for them all
def _count(ids, hist, pairs, BINS: tl.constexpr, BLOCK_P: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    expert = tl.load(ids + p, mask=p < pairs, other=0).to(tl.int32)
    tl.store(hist + tl.program_id(0) * BINS + tl.arange(0, BINS), tl.histogram(expert, BINS, mask=p < pairs))


@triton.jit
def _layout(layout, counts, experts, shared_rows, BINS: tl.constexpr, BLOCK_M: tl.constexpr):
    bins = tl.arange(0, BINS)
    counts = tl.where(bins == experts, shared_rows, counts)  # the shared expert's group: a pair a row, last
    tl.store(layout + bins, tl.cumsum(counts, axis=0) - counts)  # an expert's first grouped position
    tl.store(layout + BINS + bins, counts)  # its pairs
    tl.store(layout + 2 * BINS + bins, tl.cumsum((counts + BLOCK_M - 1) // BLOCK_M, axis=0))  # its tiles' end


@triton.jit(do_not_specialize=["blocks", "shared_rows"])  # counts of the step's rows, call by call
def _scan(hist, layout, blocks, experts, shared_rows, BINS: tl.constexpr, BLOCK_B: tl.constexpr,
          BLOCK_M: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    bins = tl.arange(0, BINS)
    running = tl.zeros([BINS], dtype=tl.int32)
    for first in range(0, blocks, BLOCK_B):
        rows = first + tl.arange(0, BLOCK_B)
        where = hist + rows[:, None] * BINS + bins[None, :]
        live = rows[:, None] < blocks
        counts = tl.load(where, mask=live, other=0)
        # In place: each block's count becomes the pairs of that expert in the blocks before it.
        tl.store(where, running[None, :] + tl.cumsum(counts, axis=0) - counts, mask=live)
        running += tl.sum(counts, axis=0)
    _layout(layout, running, experts, shared_rows, BINS, BLOCK_M)


@triton.jit
def _route(ids, pair_at, dest_at, p, live, expert, q, top_k, SLOTS: tl.constexpr):
    row, slot = p // top_k, p % top_k
    s = tl.arange(0, SLOTS)
    valid = live[:, None] & (s[None, :] < top_k)
    peers = tl.load(ids + row[:, None] * top_k + s[None, :], mask=valid, other=0).to(tl.int32)
    # The rank of this pair among its row's experts by (id, slot): where its output goes.
    below = valid & ((peers < expert[:, None]) | ((peers == expert[:, None]) & (s[None, :] < slot[:, None])))
    tl.store(pair_at + q, p, mask=live)
    tl.store(dest_at + q, row * top_k + tl.sum(below.to(tl.int32), axis=1), mask=live)


@triton.jit(do_not_specialize=["pairs"])
def _place(ids, hist, layout, pair_at, dest_at, pairs, top_k, BINS: tl.constexpr, BLOCK_P: tl.constexpr,
           SLOTS: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    lanes = tl.arange(0, BLOCK_P)
    p = tl.program_id(0) * BLOCK_P + lanes
    live = p < pairs
    expert = tl.load(ids + p, mask=live, other=0).to(tl.int32)
    # Stable: among a block's pairs of one expert, the lower pair index goes first.
    earlier = (expert[:, None] == expert[None, :]) & (lanes[None, :] < lanes[:, None])
    q = tl.load(layout + expert, mask=live, other=0) + tl.sum(earlier.to(tl.int32), axis=1) \
        + tl.load(hist + tl.program_id(0) * BINS + expert, mask=live, other=0)
    _route(ids, pair_at, dest_at, p, live, expert, q, top_k, SLOTS)


@triton.jit
def _plan_one(ids, layout, pair_at, dest_at, pairs, top_k, experts, shared_rows, BINS: tl.constexpr,
              BLOCK_P: tl.constexpr, SLOTS: tl.constexpr, BLOCK_M: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    _plan_block(ids, layout, pair_at, dest_at, pairs, top_k, experts, shared_rows, BINS, BLOCK_P, SLOTS,
                BLOCK_M)


@triton.jit
def _route_plan_one(logits, stride_l, ids, weights, rows, experts, layout, pair_at, dest_at, top_k,
                    shared_rows, K: tl.constexpr, NORM: tl.constexpr, BLOCK_E: tl.constexpr,
                    BLOCK_K: tl.constexpr, BINS: tl.constexpr, BLOCK_P: tl.constexpr, SLOTS: tl.constexpr,
                    BLOCK_M: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    for row in range(rows):  # each row's choice, as tfd_kernels.router makes it
        router.choose(logits + row * stride_l, ids + row * K, weights + row * K, experts, K, NORM, BLOCK_E,
                      BLOCK_K)
    tl.debug_barrier()  # the ids every thread wrote are there for every thread to read
    _plan_block(ids, layout, pair_at, dest_at, rows * top_k, top_k, experts, shared_rows, BINS, BLOCK_P,
                SLOTS, BLOCK_M)


@triton.jit
def _plan_block(ids, layout, pair_at, dest_at, pairs, top_k, experts, shared_rows, BINS: tl.constexpr,
                BLOCK_P: tl.constexpr, SLOTS: tl.constexpr, BLOCK_M: tl.constexpr):
    # Pairs that fit one block: positions by comparing every pair with every other, one launch in all.
    p = tl.arange(0, BLOCK_P)
    live = p < pairs
    expert = tl.load(ids + p, mask=live, other=0).to(tl.int32)
    before = live[None, :] & ((expert[None, :] < expert[:, None])
                              | ((expert[None, :] == expert[:, None]) & (p[None, :] < p[:, None])))
    _layout(layout, tl.histogram(expert, BINS, mask=live), experts, shared_rows, BINS, BLOCK_M)
    _route(ids, pair_at, dest_at, p, live, expert, tl.sum(before.to(tl.int32), axis=1), top_k, SLOTS)


class Tables(NamedTuple):
    """A plan's int32 tables (the module docstring says what each holds), for up to ``pairs``
    routed pairs among experts counted by ``bins`` (a power of two above every expert id)."""

    layout: torch.Tensor
    pair_at: torch.Tensor
    dest_at: torch.Tensor
    hist: torch.Tensor

    @classmethod
    def empty(cls, pairs: int, bins: int, device: torch.device) -> Tables:
        def table(*shape: int) -> torch.Tensor:
            return torch.empty(*shape, dtype=torch.int32, device=device)

        return cls(table(3, bins), table(pairs), table(pairs), table(triton.cdiv(pairs, PLAN_BLOCK), bins))


def plan(tables: Tables, ids: torch.Tensor, experts: int, shared: bool, block_m: int,
         choice: tuple[torch.Tensor, torch.Tensor, bool] | None = None) -> None:
    """Fill ``tables`` for the pairs of ``ids`` [rows, top_k] (contiguous, ids in [0, experts)),
    in tiles of ``block_m`` pairs; with ``shared``, one more group of ``rows`` pairs of expert
    ``experts`` after them. ``choice`` (logits [rows, experts] with unit column stride, the weights
    [rows, top_k] to write, and whether to renormalise them): the router's choice writes ``ids`` and
    those weights in the same launch first; all pairs must then fit one block (ValueError)."""
    rows, top_k = ids.shape
    pairs = rows * top_k
    blocks = triton.cdiv(pairs, PLAN_BLOCK)
    bins = tables.layout.shape[1]
    shared_rows = rows if shared else 0
    slots = triton.next_power_of_2(top_k)
    options = pdl.options(ids.device)
    if choice is not None:
        logits, weights, normalise = choice
        if pairs > CHOICE_PAIRS:
            raise ValueError(f"ids has {pairs} pairs; the choice is made with the plan for {CHOICE_PAIRS} "
                             "at most")
        _route_plan_one[(1,)](logits, logits.stride(0), ids, weights, rows, experts, tables.layout,
                              tables.pair_at, tables.dest_at, top_k, shared_rows, K=top_k, NORM=normalise,
                              BLOCK_E=triton.next_power_of_2(experts), BLOCK_K=slots, BINS=bins,
                              BLOCK_P=CHOICE_PAIRS, SLOTS=slots, BLOCK_M=block_m,
                              num_warps=router.ROUTE_WARPS, **options)
    elif blocks <= 1:
        _plan_one[(1,)](ids, tables.layout, tables.pair_at, tables.dest_at, pairs, top_k, experts,
                        shared_rows, BINS=bins, BLOCK_P=PLAN_BLOCK, SLOTS=slots, BLOCK_M=block_m, num_warps=8,
                        **options)
    else:
        _count[(blocks,)](ids, tables.hist, pairs, BINS=bins, BLOCK_P=PLAN_BLOCK, **options)
        _scan[(1,)](tables.hist, tables.layout, blocks, experts, shared_rows, BINS=bins, BLOCK_B=SCAN_BLOCK,
                    BLOCK_M=block_m, **options)
        _place[(blocks,)](ids, tables.hist, tables.layout, tables.pair_at, tables.dest_at, pairs, top_k,
                          BINS=bins, BLOCK_P=PLAN_BLOCK, SLOTS=slots, num_warps=8, **options)


@triton.jit
def tile_of(layout, tile, BINS: tl.constexpr, BLOCK_M: tl.constexpr):
    """Tile ``tile``'s expert, first grouped position and the end of its expert's pairs, from the
    plan's ``layout`` (end 0 past the last tile): how an expert kernel's program finds its pairs."""
    bins = tl.arange(0, BINS)
    ends = tl.load(layout + 2 * BINS + bins)
    expert = tl.sum((ends <= tile).to(tl.int32), axis=0)  # BINS when the tile is past the last
    safe = tl.minimum(expert, BINS - 1)
    start, count = tl.load(layout + safe), tl.load(layout + BINS + safe)
    end = tl.load(layout + 2 * BINS + safe)
    first = start + (tile - end + (count + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
    stop = tl.where(expert < BINS, start + count, 0)
    return safe, first, stop


@triton.jit
def chosen_tile(logits, ids, weights, pair_at, dest_at, tile_expert, experts, tile, writes, K: tl.constexpr,
                NORM: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, CACHE: tl.constexpr):
    """At one row, tile ``tile``'s expert and its pair's fp32 routing weight (1 for the shared expert)
    from the router's choice, which every program makes for itself (``tfd_kernels.router.choice``): tile
    t < K is the chosen expert of rank t by id, tile K the shared expert. With ``writes`` (one
    program a tile), what the router kernel and the plan would write for it: its pair's id and weight
    (in slot order), its slot, its rank, its expert. ``CACHE``: as ``tfd_kernels.router.choice``'s."""
    return chosen_tile_of(router.row_logits(logits, experts, BLOCK_E, CACHE), ids, weights, pair_at, dest_at,
                          tile_expert, experts, tile, writes, K, NORM, BLOCK_E, BLOCK_K)


@triton.jit
def chosen_tile_of(x, ids, weights, pair_at, dest_at, tile_expert, experts, tile, writes, K: tl.constexpr,
                   NORM: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    """``chosen_tile`` from the row's logits ``x`` (``tfd_kernels.router.row_logits``' form)."""
    best, picked = router.choice_of(x, experts, K, NORM, BLOCK_E, BLOCK_K)
    slots = tl.arange(0, BLOCK_K)
    live = slots < K
    rank = tl.sum((live[None, :] & (best[None, :] < best[:, None])).to(tl.int32), axis=1)  # ids are distinct
    mine = live & (rank == tile)
    expert = tl.where(tile < K, tl.sum(tl.where(mine, best, 0), axis=0).to(tl.int32), experts)
    weight = tl.sum(tl.where(mine, picked, 0.0), axis=0).to(weights.dtype.element_ty)
    if writes:
        if tile < K:
            slot = tl.sum(tl.where(mine, slots, 0), axis=0)
            tl.store(ids + slot, expert.to(tl.int64))
            tl.store(weights + slot, weight)
            tl.store(pair_at + tile, slot)
            tl.store(dest_at + tile, tile)
        tl.store(tile_expert + tile, expert)
    return expert, tl.where(tile < K, weight.to(tl.float32), 1.0)

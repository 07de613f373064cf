"""The one-row MoE launch's router (``tfd_kernels.moe_one``): its programs of the router's product (the
spread GEMM's segments, tiles and order at one row, each storing its fp32 partial and counting it), the
gate/up programs' wait for them, and the choice each of those makes from the logits or the partials
(``tfd_kernels.moe_plan``'s). Counters and their protocol: ``tfd_kernels.moe_one``'s.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tfd_kernels import gemm, moe_plan


@triton.jit
def router_early(w, program, n, k, k_per_segment, stride_w, live, TILES: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, STEP: tl.constexpr):
    """K step ``STEP`` of a router program's weights (``tfd_kernels.gemm.weight_tile``), nothing read
    unless ``live`` (a router program)."""
    column, segment = program % TILES, program // TILES
    cols = column * BLOCK_N + tl.arange(0, BLOCK_N)
    start = segment * k_per_segment + STEP * BLOCK_K
    return gemm.weight_tile(w, cols, tl.where(live, n, 0), k, start, stride_w, BLOCK_K)


@triton.jit
def router_tile(x, w, partials, logits, counters, program, n, k, k_per_segment, stride_w, b0, b1,
                 TILES: tl.constexpr, SEGMENTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, WIDEN: tl.constexpr, FROM_PARTIALS: tl.constexpr,
                 EARLY: tl.constexpr):
    """One program of the router's product at one row, as ``tfd_kernels.gemm``'s spread form computes
    it (the same segments, tiles and order), its first ``EARLY`` K steps' weights ``b0``, ``b1``
    loaded already: it stores its fp32 partial; with ``FROM_PARTIALS`` it counts it
    (``counters[TILES + 1]``), else the last program of a tile stores the tile's logits and counts
    the tile ready (``counters[TILES]``)."""
    column, segment = program % TILES, program // TILES
    rows = tl.arange(0, BLOCK_M)
    cols = column * BLOCK_N + tl.arange(0, BLOCK_N)
    # EARLY is at most 2 here (moe_one's clamp): b2, b3 are never read
    acc = gemm.segment_sum_early(x, w, b0, b1, b1, b1, rows, cols, 1, n, k, segment * k_per_segment,
                                 k_per_segment, 0, stride_w, BLOCK_M, BLOCK_N, BLOCK_K, WIDEN, EARLY)
    mask = (rows[:, None] < 1) & (cols[None, :] < n)
    where = rows[:, None] * n + cols[None, :]
    tl.store(partials + segment * n + where, acc, mask=mask)
    tl.debug_barrier()  # every thread's part of the partial is written before it is counted
    if FROM_PARTIALS:  # the choosing programs sum the partials: count them stored, nothing more
        tl.atomic_add(counters + TILES + 1, 1, sem="release", scope="gpu")
    elif tl.atomic_add(counters + column, 1, sem="acq_rel", scope="gpu") == SEGMENTS - 1:
        total = gemm.summed(partials, n, where, mask, SEGMENTS).to(logits.dtype.element_ty)
        tl.store(logits + where, total, mask=mask)
        tl.debug_barrier()  # the tile's logits are stored before it counts ready
        tl.atomic_xchg(counters + column, 0, sem="relaxed", scope="gpu")
        tl.atomic_add(counters + TILES, 1, sem="release", scope="gpu")


@triton.jit
def logits_wait(router_counters, ROUTER_TILES: tl.constexpr, SEGMENTS: tl.constexpr,
                 FROM_PARTIALS: tl.constexpr):
    """With the router's product in the launch, wait until every tile of the logits is stored (with
    ``FROM_PARTIALS``, every partial)."""
    if ROUTER_TILES > 0:
        if FROM_PARTIALS:
            while tl.atomic_add(router_counters + ROUTER_TILES + 1, 0, sem="acquire", scope="gpu") \
                    < ROUTER_TILES * SEGMENTS:
                pass
        else:
            while tl.atomic_add(router_counters + ROUTER_TILES, 0, sem="acquire", scope="gpu") < ROUTER_TILES:
                pass


@triton.jit
def choice_of(logits, partials, n, ids, weights, pair_at, dest_at, tile_expert, experts, tile, writes,
            K: tl.constexpr, NORM: tl.constexpr, BLOCK_E: tl.constexpr, SLOTS: tl.constexpr,
            CACHE: tl.constexpr, SEGMENTS: tl.constexpr, FROM_PARTIALS: tl.constexpr):
    """``tfd_kernels.moe_plan.chosen_tile``, its logits read or (``FROM_PARTIALS``) summed from the
    router's partials as the tile's last program would sum them; a writing program of tile 0 then
    stores them, as the logits the launch promises."""
    if FROM_PARTIALS:
        e = tl.arange(0, BLOCK_E)
        summed = gemm.summed(partials, n, e, e < experts, SEGMENTS).to(logits.dtype.element_ty)
        if writes and tile == 0:
            tl.store(logits + e, summed, mask=e < experts)
        x = tl.where(e < experts, summed.to(tl.float32), float("-inf"))
        chosen = moe_plan.chosen_tile_of(x, ids, weights, pair_at, dest_at, tile_expert, experts, tile,
                                         writes, K, NORM, BLOCK_E, SLOTS)
    else:
        chosen = moe_plan.chosen_tile(logits, ids, weights, pair_at, dest_at, tile_expert, experts, tile,
                                      writes, K, NORM, BLOCK_E, SLOTS, CACHE)
    return chosen

"""The one-row MoE launch's reading of its input and its router (``kernels.moe_one``): the input row
formed before the add and norm where asked, the router's product in ``kernels.gemm``'s segments and
order, the wait for its partials, and the choice each choosing program makes from them.

Each is a piece of that launch's programs, never launched alone; the launch's docstring states what
each program waits on and why that cannot deadlock.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels import gemm, moe_plan, norm


@triton.jit
def row_input(x, added_delta, added_weight, added_eps, slots, hidden, dtype: tl.constexpr,
              HIDDEN_BLOCK: tl.constexpr, ADDED: tl.constexpr):
    """The block's input row for a program that reads it: ``x``, or with ``ADDED`` the zero-centred
    norm of x + the mixer's output, formed into the program's own row of ``slots`` (``_add_zrms``'s
    arithmetic and warps, so its bits)."""
    row = x
    if ADDED:
        every = tl.arange(0, HIDDEN_BLOCK)
        whole = every < hidden
        summed = norm.added(x, tl.load(added_delta + every, mask=whole, other=0.0), every, whole, dtype)
        row = slots + tl.program_id(0) * hidden
        norm.zrms_row(summed.to(tl.float32), row, added_weight, every, every, whole, hidden, added_eps)
        tl.debug_barrier()  # every thread's part of the row is stored before any reads it back
    return row


@triton.jit
def router_tile(x, w, partials, logits, counters, program, n, k, k_per_segment, stride_w, added_delta,
                added_weight, added_eps, slots, dtype: tl.constexpr, TILES: tl.constexpr,
                SEGMENTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                WIDEN: tl.constexpr, FROM_PARTIALS: tl.constexpr, HIDDEN_BLOCK: tl.constexpr,
                ADDED: tl.constexpr, FOUR: tl.constexpr):
    """One program of the router's product at one row (``k`` the block's hidden size), as
    ``kernels.gemm``'s spread form computes it (the same segments, tiles and order): it stores its fp32
    partial; with ``FROM_PARTIALS`` it counts it (``counters[TILES + 1]``), else the last program of a
    tile stores the tile's logits and counts the tile ready (``counters[TILES]``). With ``ADDED`` it
    forms the row first (``row_input``); with ``FOUR`` (a segment of four K steps) it asks for its
    weights before that, so they arrive while the norm is made."""
    column, segment = program % TILES, program // TILES
    rows = tl.arange(0, BLOCK_M)
    cols = column * BLOCK_N + tl.arange(0, BLOCK_N)
    start = segment * k_per_segment
    if FOUR:  # kernels.gemm.segment_sum's four steps, the weights asked for first
        ks = start + tl.arange(0, BLOCK_K)
        b0 = gemm.weight_step(w, cols, n, k, ks, stride_w)
        b1 = gemm.weight_step(w, cols, n, k, ks + BLOCK_K, stride_w)
        b2 = gemm.weight_step(w, cols, n, k, ks + 2 * BLOCK_K, stride_w)
        b3 = gemm.weight_step(w, cols, n, k, ks + 3 * BLOCK_K, stride_w)
        x = row_input(x, added_delta, added_weight, added_eps, slots, k, dtype, HIDDEN_BLOCK, ADDED)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = gemm.step_sum(gemm.input_step(x, rows, 1, k, ks, 0), b0, acc, WIDEN)
        acc = gemm.step_sum(gemm.input_step(x, rows, 1, k, ks + BLOCK_K, 0), b1, acc, WIDEN)
        acc = gemm.step_sum(gemm.input_step(x, rows, 1, k, ks + 2 * BLOCK_K, 0), b2, acc, WIDEN)
        acc = gemm.step_sum(gemm.input_step(x, rows, 1, k, ks + 3 * BLOCK_K, 0), b3, acc, WIDEN)
    else:
        x = row_input(x, added_delta, added_weight, added_eps, slots, k, dtype, HIDDEN_BLOCK, ADDED)
        acc = gemm.segment_sum(x, w, rows, cols, 1, n, k, start, k_per_segment, 0, stride_w, BLOCK_M, BLOCK_N,
                               BLOCK_K, WIDEN)
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
    """``kernels.moe_plan.chosen_tile``, its logits read or (``FROM_PARTIALS``) summed from the
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

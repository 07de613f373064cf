"""An MoE block at one row in one launch (``tfd_kernels.moe`` at decode, one lane): the same bits as its
launches one after another, without the boundaries between them.

The launch's first programs make the router's product when it is given (``tfd_kernels.gemm``'s
segments and order, in ``ROUTER_N``-column tiles; each program stores its fp32 partial and counts
it), then come the gate/up programs (a tile's expert by ``tfd_kernels.moe_plan.chosen_tile_of``, the
router's choice each makes for itself once every partial is stored, from the partials summed in
segment order and rounded as the logits: ``FROM_PARTIALS``), then the down programs. A routed down
program takes its tile's expert and pair weight from the tile's first gate/up program, which publishes
them behind a flag once chosen (``DOWN_TAKES_CHOICE``; off, it makes the same choice itself, a third
more programs choosing on the same multiprocessors); it waits on its tile's ready counter (one
arrival a gate/up program of the tile) before it reads h from L2, its weights (four K steps) already
asked for. The shared expert's programs come first and make no choice, so they read while the
router's product runs (``SHARED_DOWN_LAST`` puts its down programs last instead).

The finish is spread (``SPREAD_FINISH``, ``tfd_kernels.moe_sum.finish_spread``): the last down program
of each column block to arrive (a counter a block) sums the block's ranks in order, adds the shared
expert and at decode the residual, and stores those columns of the stream; the last block to finish
(the arrival counter, counting blocks) reloads the stored row and normalises it with the norm's own
code (``tfd_kernels.norm.zrms_row``, the same warps and reduction), then rearms the launch's counters.
Each block's columns are elementwise and the norm reads back the rounded values it would have held,
so the bits are those of the last down program doing all of it alone (the flag off: ~3 us a layer
that one program spent while memory idled). Each program counts after a barrier and its stores
(release) and reads what others stored only after the count that saw theirs (acquire), from L2.

FP8 expert weights (``tfd_kernels.moe_fp8``): each tile's products follow its expert's kind, the routed
experts' and the shared expert's each; with four 128-wide K blocks of one kind both ways, the down
programs ask for FP8 weights and their scales early, as for float ones. x's row is quantized once by
``tfd_kernels.fp8_gemm.quantize``, a launch before this one (where gate/up weights are FP8), which the
gate/up programs load. Where down weights are FP8, the middle is quantized once in the launch: the
tile's last gate/up program to count its h stored (its ready counter, acq_rel) quantizes the tile's
one row of h and counts once more, and the down programs wait for that count, then load the quantized
row and its scales (``moe_fp8.rows_block``) instead of each quantizing a padded tile of h.

Waiting inside a launch needs the programs it waits on to run: GPUs start a launch's programs in
order of their index, and every program waits only on programs of lower index (down on gate/up,
both on the router's), so each one is running or done before any program can wait on it. The
interpreter runs programs in order. Scratch: the caller's h, buffer and logits, the router's fp32
partials, with FP8 weights x's and h's quantized rows (a byte an element) and their fp32 scales; the
device's counters (zero between launches).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import gemm_plan, moe_fp8, moe_plan, moe_sum, moe_tiles, norm, pdl, router, runtime
from tfd_kernels.fp8_gemm import quantize
from tfd_kernels.moe_args import Operand
from tfd_kernels.moe_one_router import choice_of, logits_wait, router_early, router_tile
from tfd_kernels.runtime import INTERPRETED

READY = 64  # tiles of one launch at most: top_k routed experts and the shared one
ROUTER_TILES = 32  # column tiles of the router's product at most, when it runs in the launch
# Columns of a router program's tile (0: gemm's one-row tile, 64): narrower tiles are more programs that
# each read less (35B-A3B one stream: 32 2.495 ms, 64 2.516, 16 2.521). The same bits on the GPU for any
# width (its MMA sums a column alike; GPU test); the interpreter's numpy dot sums in an order that
# follows the width, so there it keeps gemm's.
ROUTER_N = 32
# The shared expert's programs first, not waiting for the router's choice (off: in rank order, after it).
SHARED_FIRST = True
# With SHARED_FIRST, the shared expert's down programs last all the same (off: first). On, the programs
# that start late (468 programs, 396 resident) are the shared expert's downs, whose outputs every column
# block's finish needs: 35B-A3B one stream 2.7098 ms against 2.6689 with both flags off (H200).
SHARED_DOWN_LAST = False
# A routed down program takes its tile's choice from the tile's first gate/up program (its expert and
# weight, published behind a flag) instead of making it: the choosing programs share their multiprocessors
# with a third as many choosing beside them (off: every down program chooses too; same bits).
DOWN_TAKES_CHOICE = True
# A down program asks for its weights (four K steps) before it waits for h; off, it reads them after.
PRELOAD_DOWN = True
# Each column block's last down program sums its columns, the last of those normalises (off: the last
# down program does all of it alone, ~3 us a layer at one row on the H200; same bits either way).
SPREAD_FINISH = True
COLUMNS = 64  # column blocks of the down programs at most, for SPREAD_FINISH's counters
# With the router's product in the launch, the choosing programs sum its fp32 partials themselves (in
# segment order, rounded as the logits: the same bits), so no tile's last program sums and stores logits
# first; the finish sums the shared expert's gate from them too (2.516 against 2.543 ms a 35B-A3B step).
# Off: each tile's last program sums and stores its logits, which the choosing programs read.
FROM_PARTIALS = True
# K steps (0 to 2) of its weights a router program asks for before the launch's wait, so they come while
# the kernel before (the add and norm) ends. H200, 35B-A3B one stream, tfd bench --variant (best of three):
# 1 step 2.4433 ms, 2 steps 2.4518, none 2.4488; with the qkv product's early step 2.4379 / 2.4457.
ROUTER_EARLY = 1
# Rows of the block in which a tile's last gate/up program quantizes its one middle for the FP8 down
# programs (one live; a dot's smallest rows).
QUANTIZE_M = 16


@triton.jit
def _tile_first(index, K: tl.constexpr, TILES: tl.constexpr, SHARED_FIRST: tl.constexpr):
    """The tile of a program's place among the tiles: with ``SHARED_FIRST`` the shared expert's
    (tile K) first, so its programs start while the router's choice is still being made."""
    if SHARED_FIRST and TILES > K:
        index = (index + K) % TILES
    return index


@triton.jit
def _one_row(x, xq, x_scales, gate_up, gate_scales, shared_gate_up, shared_gate_scales, h, hq, h_scales, down,
             down_scales, shared_down, shared_down_scales, buf, logits, ids, weights, pair_at, dest_at,
             tile_expert, tile_weight, chosen, ready, arrivals, blocks, gate, residual, total, out,
             norm_weight, experts, hidden, inner, shared_inner, width, stride_ge, stride_gn, stride_gs,
             stride_de, stride_dn, stride_ds, stride_g, eps, router_w, partials, router_counters, router_n,
             router_k_per_segment,
             K: tl.constexpr, NORM: tl.constexpr, BLOCK_E: tl.constexpr, SLOTS: tl.constexpr,
             TILES: tl.constexpr, GATE_COLS: tl.constexpr, DOWN_COLS: tl.constexpr, PRECISION: tl.constexpr,
             WIDEN: tl.constexpr, BLOCK_M: tl.constexpr, GATE_N: tl.constexpr, GATE_K: tl.constexpr,
             DOWN_N: tl.constexpr, DOWN_K: tl.constexpr, SHARED: tl.constexpr, ADD_NORM: tl.constexpr,
             HIDDEN_BLOCK: tl.constexpr, COUNTERS: tl.constexpr, ROUTER_TILES: tl.constexpr,
             ROUTER_SEGMENTS: tl.constexpr, ROUTER_M: tl.constexpr, ROUTER_N: tl.constexpr,
             ROUTER_K: tl.constexpr, LOGITS_CACHE: tl.constexpr, SHARED_FIRST: tl.constexpr,
             DOWN_SHARED_FIRST: tl.constexpr, TAKE_CHOICE: tl.constexpr,
             PRELOAD: tl.constexpr, SPREAD: tl.constexpr, FROM_PARTIALS: tl.constexpr,
             GATE_SEGMENTS: tl.constexpr, ROUTER_EARLY: tl.constexpr, GATE_FP8: tl.constexpr,
             SHARED_GATE_FP8: tl.constexpr, DOWN_FP8: tl.constexpr, SHARED_DOWN_FP8: tl.constexpr,
             QUANTIZE_M: tl.constexpr, PDL: tl.constexpr):
    program = tl.program_id(0) - ROUTER_TILES * ROUTER_SEGMENTS  # the router's programs first, if here
    rb0, rb1 = router_w, router_w  # unread unless asked for below
    if ROUTER_EARLY:  # a router program's first weights asked for before the wait
        rb0 = router_early(router_w, tl.program_id(0), router_n, hidden, router_k_per_segment, hidden,
                          program < 0, ROUTER_TILES, ROUTER_N, ROUTER_K, 0)
        if ROUTER_EARLY > 1:
            rb1 = router_early(router_w, tl.program_id(0), router_n, hidden, router_k_per_segment, hidden,
                              program < 0, ROUTER_TILES, ROUTER_N, ROUTER_K, 1)
    pdl.wait(PDL)
    q = tl.arange(0, BLOCK_M)
    live = q < 1  # a tile is one pair at one row
    if program < 0:
        router_tile(x, router_w, partials, logits, router_counters, tl.program_id(0), router_n, hidden,
                    router_k_per_segment, hidden, rb0, rb1, ROUTER_TILES, ROUTER_SEGMENTS, ROUTER_M,
                    ROUTER_N, ROUTER_K, WIDEN, FROM_PARTIALS, ROUTER_EARLY)
        return
    if program < TILES * GATE_COLS:
        tile, column = _tile_first(program // GATE_COLS, K, TILES, SHARED_FIRST), program % GATE_COLS
        if column * GATE_N >= tl.where(tile < K, inner, shared_inner):  # past the expert's columns
            return
        if SHARED_FIRST and tile == K:  # the shared expert needs no choice
            expert = tl.full([], 0, tl.int32) + experts
            if column == 0:
                tl.store(tile_expert + tile, expert)
        else:
            logits_wait(router_counters, ROUTER_TILES, ROUTER_SEGMENTS, FROM_PARTIALS)
            expert, weight = choice_of(logits, partials, router_n, ids, weights, pair_at, dest_at,
                                       tile_expert, experts, tile, column == 0, K, NORM, BLOCK_E, SLOTS,
                                       LOGITS_CACHE, ROUTER_SEGMENTS, FROM_PARTIALS)
            if TAKE_CHOICE and column == 0:  # published for the tile's down programs (tile_expert: stored)
                tl.store(tile_weight + tile, weight)
                tl.debug_barrier()  # every thread's stores are done before the flag shows them
                tl.atomic_add(chosen + tile, 1, sem="release", scope="gpu")
        moe_fp8.gate_up_of(x, xq, x_scales, gate_up, gate_scales, shared_gate_up, shared_gate_scales, expert,
                           experts, stride_ge, stride_gn, stride_gs, inner, shared_inner, h, tile + q, live,
                           q * 0, 1, hidden, width, 0, column, PRECISION, WIDEN, BLOCK_M, GATE_N, GATE_K,
                           GATE_FP8, SHARED_GATE_FP8)
        tl.debug_barrier()  # every thread's part of h is stored before the tile counts it
        if DOWN_FP8 or SHARED_DOWN_FP8:  # the tile's last gate/up program quantizes its middle, counted again
            size = tl.where(tile < K, inner, shared_inner)
            wanted = (size + GATE_N - 1) // GATE_N  # the tile's gate/up programs that store h
            if tl.atomic_add(ready + tile, 1, sem="acq_rel", scope="gpu") == wanted - 1:
                rows = tile + tl.arange(0, QUANTIZE_M)
                sizes = tl.zeros([QUANTIZE_M], tl.int32) + size
                for start in range(0, size, moe_fp8.STEP):
                    moe_fp8.quantize_block(h, hq, h_scales, rows, tile + 1, sizes, width, start, QUANTIZE_M,
                                           WIDEN)
                tl.debug_barrier()  # every thread's part of the quantized middle is stored before it counts
                tl.atomic_add(ready + tile, 1, sem="release", scope="gpu")
        else:
            tl.atomic_add(ready + tile, 1, sem="release", scope="gpu")
    else:
        index = program - TILES * GATE_COLS
        tile, column = _tile_first(index // DOWN_COLS, K, TILES, DOWN_SHARED_FIRST), index % DOWN_COLS
        if SHARED_FIRST and tile == K:
            expert, weight = tl.full([], 0, tl.int32) + experts, tl.full([], 1.0, tl.float32)
        elif TAKE_CHOICE:
            while tl.atomic_add(chosen + tile, 0, sem="acquire", scope="gpu") < 1:
                pass
            expert = tl.load(tile_expert + tile, cache_modifier=".cg")
            weight = tl.load(tile_weight + tile, cache_modifier=".cg")
        else:
            logits_wait(router_counters, ROUTER_TILES, ROUTER_SEGMENTS, FROM_PARTIALS)
            expert, weight = choice_of(logits, partials, router_n, ids, weights, pair_at, dest_at,
                                       tile_expert, experts, tile, False, K, NORM, BLOCK_E, SLOTS,
                                       LOGITS_CACHE, ROUTER_SEGMENTS, FROM_PARTIALS)
        size = tl.where(expert == experts, shared_inner, inner)  # the expert's inner size
        pair_weight = tl.full([BLOCK_M], 1.0, tl.float32) * weight
        if PRELOAD == 4:  # the weights asked for before the wait: they arrive while gate/up runs
            # (one kind both ways: launch), so the expert's matrix is picked by address
            w, stride_n, size = moe_tiles.weight_of(down, shared_down, expert, experts, stride_de,
                                                    stride_dn, stride_ds, inner, shared_inner)
            scales = moe_fp8.scales_of(down_scales, shared_down_scales, expert, experts,
                                       moe_fp8.blocks(hidden) * moe_fp8.blocks(inner))  # read where FP8
            b0, s0 = moe_fp8.early(w, scales, stride_n, size, hidden, column, 0, DOWN_N, DOWN_K, DOWN_FP8)
            b1, s1 = moe_fp8.early(w, scales, stride_n, size, hidden, column, 1, DOWN_N, DOWN_K, DOWN_FP8)
            b2, s2 = moe_fp8.early(w, scales, stride_n, size, hidden, column, 2, DOWN_N, DOWN_K, DOWN_FP8)
            b3, s3 = moe_fp8.early(w, scales, stride_n, size, hidden, column, 3, DOWN_N, DOWN_K, DOWN_FP8)
        wanted = (size + GATE_N - 1) // GATE_N  # the tile's gate/up programs that store h
        if DOWN_FP8 or SHARED_DOWN_FP8:
            wanted += 1  # and the last of them quantizing it
        while tl.atomic_add(ready + tile, 0, sem="acquire", scope="gpu") < wanted:
            pass
        if PRELOAD == 4:
            if DOWN_FP8:
                acc = moe_fp8.down_four(hq, h_scales, b0, s0, b1, s1, b2, s2, b3, s3, tile + q, tile + 1,
                                        width, size, WIDEN)
            else:
                acc = moe_tiles.down_four(h, b0, b1, b2, b3, tile + q, live, width, size, PRECISION, WIDEN,
                                          BLOCK_M, DOWN_N, DOWN_K)
            moe_tiles.down_store(buf, acc, live, pair_weight, tile + q, hidden, column, DOWN_N)
        else:
            moe_fp8.down_of(h, hq, h_scales, down, down_scales, shared_down, shared_down_scales, expert,
                            experts, stride_de, stride_dn, stride_ds, inner, shared_inner, buf, tile + q,
                            live, tile + 1, pair_weight, tile + q, hidden, width, column, PRECISION, WIDEN,
                            BLOCK_M, DOWN_N, DOWN_K, ".cg", DOWN_FP8, SHARED_DOWN_FP8)
        tl.debug_barrier()  # every thread's part of the tile is written before it is counted
        if SPREAD:  # the block's last program sums it, the last block's normalises (arrivals: the blocks)
            last = moe_sum.finish_spread(buf, gate, residual, total, out, norm_weight, blocks, arrivals,
                                         column, TILES, DOWN_COLS, K, hidden, stride_g, eps, K, SHARED,
                                         ADD_NORM, DOWN_N, HIDDEN_BLOCK, GATE_SEGMENTS)
        else:
            last = tl.atomic_add(arrivals, 1, sem="acq_rel", scope="gpu") == TILES * DOWN_COLS - 1
            if last:
                if ADD_NORM:
                    moe_sum.combined_add_zrms(buf, gate, residual, total, out, norm_weight, 0, K, hidden,
                                              stride_g, eps, K, SHARED, HIDDEN_BLOCK, GATE_SEGMENTS)
                else:
                    cols = tl.arange(0, HIDDEN_BLOCK)
                    dtype = total.dtype.element_ty
                    delta = moe_sum.combined(buf, gate, 0, cols, K, hidden, stride_g, K, SHARED, dtype,
                                             GATE_SEGMENTS)
                    tl.store(total + cols, delta, mask=cols < hidden)
                tl.atomic_xchg(arrivals, 0, sem="relaxed", scope="gpu")  # rearmed for the next launch
        if last:  # every down program has passed its waits: the counters it waited on rearmed
            tiles = tl.arange(0, COUNTERS)
            tl.store(ready + tiles, tl.zeros([COUNTERS], tl.int32), mask=tiles < TILES)
            if TAKE_CHOICE:
                tl.store(chosen + tiles, tl.zeros([COUNTERS], tl.int32), mask=tiles < TILES)
            if ROUTER_TILES > 0:
                tl.atomic_xchg(router_counters + ROUTER_TILES, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(router_counters + ROUTER_TILES + 1, 0, sem="relaxed", scope="gpu")


def fits(hidden: int, tiles: int, norms: bool) -> bool:
    """Whether the one launch serves this block: its counters hold the tiles, and where it ends with the
    residual's add and norm (``norms``) its warps (the router's choice) are that norm's
    (``tfd_kernels.norm.warps``); without them its finish is elementwise, in any warps (Flash Next's block,
    hidden 2,560: a norm's 8 warps)."""
    return tiles <= READY and (not norms or norm.warps(triton.next_power_of_2(hidden)) == router.ROUTE_WARPS)


def _router_n(few: gemm_plan.Tiles) -> int:
    """Columns of the router's tiles in the launch (``ROUTER_N``, gemm's in the interpreter)."""
    return few.block_n if INTERPRETED or not ROUTER_N else ROUTER_N


def takes_router(n: int, hidden: int) -> bool:
    """Whether the router's product ([n, hidden] weight) can run in the launch with the bits
    ``tfd_kernels.gemm.matmul`` gives it at one row: its tiles fit the counters, and its spread tile has
    the launch's warps."""
    few = gemm_plan.plan(n, hidden).few
    return triton.cdiv(n, _router_n(few)) <= ROUTER_TILES and few.warps == router.ROUTE_WARPS


def counters(device: torch.device) -> torch.Tensor:
    """The device's counters: ``READY`` tiles' ready counts, the down programs' arrivals (with
    ``SPREAD_FINISH``, the column blocks' finished), the router's ``ROUTER_TILES`` tiles' arrivals
    and its stored tiles and stored partials, then ``COLUMNS`` column blocks' arrivals, then ``READY``
    tiles' published choices (``DOWN_TAKES_CHOICE``); the programs that finish rearm them."""
    return runtime.counters("moe_one", READY + ROUTER_TILES + 3 + COLUMNS + READY, device)


def launch(x: torch.Tensor, gate_up: Operand, shared_gate_up: Operand, h: torch.Tensor,
           down: Operand, shared_down: Operand, buf: torch.Tensor, logits: torch.Tensor,
           normalise: bool, ids: torch.Tensor, weights: torch.Tensor, tables: moe_plan.Tables,
           tile_expert: torch.Tensor, gate: torch.Tensor, shared: bool, total: torch.Tensor,
           residual: tuple[torch.Tensor, torch.Tensor, float, torch.Tensor] | None,
           tiles: dict[str, int], router_weight: torch.Tensor | None = None,
           x_rows: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """One row's block into ``total`` (the residual stream at decode, with ``residual`` = (the
    stream before, the norm's weight, eps, where the normed row goes)); the other arguments are
    ``tfd_kernels.moe._experts``' (checked there; the four weights float or FP8 each, ``tiles``' block_m
    ``tfd_kernels.moe.FP8_M`` where any is FP8), ``tiles`` its tile sizes. ``ids`` and ``weights``
    are written as the router kernel would. With ``router_weight`` (contiguous, ``takes_router``),
    the launch first makes ``tfd_kernels.gemm.matmul(x, router_weight)`` and writes its experts' columns
    into ``logits`` (and, with ``FROM_PARTIALS`` off, the shared expert's gate after them, where
    ``gate`` views it; on, the finish sums the gate from the partials and ``gate`` is not read);
    scratch: its fp32 partials. ``x_rows``: x's row quantized already (``tfd_kernels.fp8_rows``), which
    FP8 gate/up tiles read instead of quantizing it in a launch before."""
    experts, hidden, inner = down.data.shape
    top_k = ids.shape[1]
    count = top_k + shared
    gate_cols = triton.cdiv(h.shape[1], tiles["gate_n"])
    down_cols = triton.cdiv(hidden, tiles["down_n"])
    found = counters(x.device)
    stream, weight, eps, normed = residual if residual is not None else (total, total, 0.0, total)
    block = triton.next_power_of_2(hidden)
    n_router, plan = 0, gemm_plan.plan(1, 1)
    if router_weight is not None:
        n_router, plan = router_weight.shape[0], gemm_plan.plan(*router_weight.shape)
    router_tiles = triton.cdiv(n_router, _router_n(plan.few))
    # four K steps of weights a down program, the shared expert's as the routed ones' (one kind)
    step = moe_fp8.STEP.value if down.fp8 else tiles["down_k"]
    preload = PRELOAD_DOWN and inner == 4 * step and shared_down.data.shape[1] == inner \
        and shared_down.fp8 == down.fp8
    partials = torch.empty(plan.segments if router_weight is not None else 1, n_router, dtype=torch.float32,
                           device=x.device)
    blocks = found[READY + ROUTER_TILES + 3:]  # the column blocks' counters, past the router's
    chosen = found[READY + ROUTER_TILES + 3 + COLUMNS:]  # the tiles' published choices, past the blocks'
    # fp32 on a GPU: sm_90's code pairs the norm's squares into FMAs one way for a row in registers and
    # another for a row loaded back, so there the last program normalises alone (2-byte dtypes agree).
    exact = residual is None or x.dtype != torch.float32 or INTERPRETED
    from_partials = FROM_PARTIALS and router_weight is not None
    early = 0 if router_weight is None else min(ROUTER_EARLY, 2, plan.k_per_segment // plan.few.block_k)
    if from_partials and shared:  # the finish sums the gate's column of the partials, a segment apart
        gate = partials[:, experts:experts + 1]
    # FP8 gate/up tiles read x's row quantized once: by the kernel that made it (``x_rows``) or a launch
    # before (stand-ins where float: never read)
    xq, x_scales = (x, x) if not (gate_up.fp8 or shared_gate_up.fp8) else x_rows or quantize(x)
    # FP8 down tiles read the middles quantized once, by each tile's last gate/up program
    hq, h_scales = (h, h) if not (down.fp8 or shared_down.fp8) else (
        torch.empty(h.shape, dtype=torch.float8_e4m3fn, device=x.device),
        torch.empty(h.shape[0], triton.cdiv(h.shape[1], moe_fp8.STEP.value), dtype=torch.float32,
                    device=x.device))
    _one_row[(router_tiles * plan.segments + count * (gate_cols + down_cols),)](
        x, xq, x_scales, *gate_up[:2], *shared_gate_up[:2], h, hq, h_scales, *down[:2], *shared_down[:2], buf,
        logits, ids, weights,
        tables.pair_at, tables.dest_at, tile_expert, torch.empty(count, dtype=torch.float32, device=x.device),
        chosen, found, found[READY:], blocks, gate, stream, total, normed, weight,
        experts, hidden, inner, shared_down.data.shape[1], h.shape[1], *gate_up.data.stride()[:2],
        shared_gate_up.data.stride(0), *down.data.stride()[:2], shared_down.data.stride(0), gate.stride(0),
        eps,
        router_weight if router_weight is not None else x, partials, found[READY + 1:], n_router,
        plan.k_per_segment, K=top_k, NORM=normalise, BLOCK_E=triton.next_power_of_2(experts),
        SLOTS=triton.next_power_of_2(top_k), TILES=count, GATE_COLS=gate_cols, DOWN_COLS=down_cols,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", WIDEN=INTERPRETED, BLOCK_M=tiles["block_m"],
        GATE_N=tiles["gate_n"], GATE_K=tiles["gate_k"], DOWN_N=tiles["down_n"], DOWN_K=tiles["down_k"],
        SHARED=shared, ADD_NORM=residual is not None, HIDDEN_BLOCK=block, COUNTERS=READY,
        ROUTER_TILES=router_tiles, ROUTER_SEGMENTS=plan.segments, ROUTER_M=plan.few.block_m,
        ROUTER_N=_router_n(plan.few), ROUTER_K=plan.few.block_k,
        LOGITS_CACHE=".cg" if router_weight is not None else "", SHARED_FIRST=SHARED_FIRST and shared,
        DOWN_SHARED_FIRST=SHARED_FIRST and shared and not SHARED_DOWN_LAST, TAKE_CHOICE=DOWN_TAKES_CHOICE,
        PRELOAD=4 if preload else 0, SPREAD=SPREAD_FINISH and down_cols <= COLUMNS and exact,
        FROM_PARTIALS=from_partials, GATE_SEGMENTS=plan.segments if from_partials and shared else 0,
        ROUTER_EARLY=early, GATE_FP8=gate_up.fp8, SHARED_GATE_FP8=shared_gate_up.fp8, DOWN_FP8=down.fp8,
        SHARED_DOWN_FP8=shared_down.fp8, QUANTIZE_M=QUANTIZE_M, num_warps=router.ROUTE_WARPS,
        num_stages=tiles["stages"],
        **pdl.options(x.device))

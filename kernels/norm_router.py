"""The add and norm before an MoE block joined with the block's router product, at one row (decode,
one lane): ``kernels.norm.add_zrms``'s residual sum and norm, then ``kernels.gemm.matmul`` of the
normed row by the router's weight, in one launch with the same bits as the two.

Every program makes the row's sum and norm itself (a 2,048-wide row: a few loads, one reduction;
``kernels.norm.add_zrms_row`` in its warps, so the same bits) and stores them, all programs the same
values; then it reads the normed row back and makes one (column tile, K segment) part of the
router's product as ``kernels.gemm``'s spread form does: the same segments (``gemm.plan``), K steps
and order, so the same bits; the last program of a column tile (an arrival counter) adds the
segments in order and stores the tile's logits. Without this the router's product ran at the head
of the MoE launch (``kernels.moe_one``), ~5 us a layer during which the routed experts' weights
could not stream; here its weight tiles are asked for before the norm (``PRELOAD``), so they arrive
while the row is being summed.

Scratch: fp32 partials (segments x columns), freed on return; the device's counters (zero between
launches, each tile's last program rearms its own). ``ENABLED`` turns the join off for comparisons.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import kernels
from kernels import INTERPRETED, gemm, norm, pdl

ENABLED = True
# Columns a program takes: 9 tiles of a 257-row router, 36 programs of 32 KB with 4 segments. The same bits
# as gemm's 64 on the GPU (tile widths never change a product's bits there); the interpreter's fp32 dot
# sums in an order that follows the width, so it takes gemm's.
BLOCK_N = 32
TILES = 64  # column tiles at most (the counters)
# Weight tiles a program asks for before the norm: 4 (a whole segment of four K steps) or 0 (in the loop).
PRELOAD = 4
# Where the preloaded tiles are asked for: before the wait on the kernel before (1) or after it (0).
EARLY = 0


@triton.jit
def _norm_router(x, delta, total, out, weight, w, partials, logits, counters, width, n, eps, k_per_segment,
                 SEGMENTS: tl.constexpr, TILES: tl.constexpr, BLOCK: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WIDEN: tl.constexpr, PRELOAD: tl.constexpr,
                 EARLY: tl.constexpr, LATE: tl.constexpr, PDL: tl.constexpr):
    column, segment = tl.program_id(0) % TILES, tl.program_id(0) // TILES
    cols = column * BLOCK_N + tl.arange(0, BLOCK_N)
    start = segment * k_per_segment
    if EARLY:  # the weights depend on nothing the kernel before writes
        b0 = gemm.weight_tile(w, cols, n, width, start, width, BLOCK_K)
        b1 = gemm.weight_tile(w, cols, n, width, start + BLOCK_K, width, BLOCK_K)
        b2 = gemm.weight_tile(w, cols, n, width, start + 2 * BLOCK_K, width, BLOCK_K)
        b3 = gemm.weight_tile(w, cols, n, width, start + 3 * BLOCK_K, width, BLOCK_K)
    pdl.wait(PDL)
    if LATE:
        b0 = gemm.weight_tile(w, cols, n, width, start, width, BLOCK_K)
        b1 = gemm.weight_tile(w, cols, n, width, start + BLOCK_K, width, BLOCK_K)
        b2 = gemm.weight_tile(w, cols, n, width, start + 2 * BLOCK_K, width, BLOCK_K)
        b3 = gemm.weight_tile(w, cols, n, width, start + 3 * BLOCK_K, width, BLOCK_K)
    hidden = tl.arange(0, BLOCK)
    delta_row = tl.load(delta + hidden, mask=hidden < width, other=0.0)
    norm.add_zrms_row(x, delta_row, total, out, weight, 0, width, eps, BLOCK)  # every program: the same bits
    tl.debug_barrier()  # the normed row every thread stored is there for every thread to read
    rows = tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if PRELOAD == 4:
        acc = gemm.segment_step(out, b0, acc, rows, 1, width, start, width, BLOCK_K, WIDEN)
        acc = gemm.segment_step(out, b1, acc, rows, 1, width, start + BLOCK_K, width, BLOCK_K, WIDEN)
        acc = gemm.segment_step(out, b2, acc, rows, 1, width, start + 2 * BLOCK_K, width, BLOCK_K, WIDEN)
        acc = gemm.segment_step(out, b3, acc, rows, 1, width, start + 3 * BLOCK_K, width, BLOCK_K, WIDEN)
    else:
        acc = gemm.segment_sum(out, w, rows, cols, 1, n, width, start, k_per_segment, width, width,
                               BLOCK_M, BLOCK_N, BLOCK_K, WIDEN)
    mask = (rows[:, None] < 1) & (cols[None, :] < n)
    where = rows[:, None] * n + cols[None, :]
    tl.store(partials + segment * n + where, acc, mask=mask)
    tl.debug_barrier()  # every thread's part of the partial is written before it is counted
    if tl.atomic_add(counters + column, 1, sem="acq_rel", scope="gpu") == SEGMENTS - 1:
        tl.store(logits + where, gemm.summed(partials, n, where, mask, SEGMENTS).to(logits.dtype.element_ty),
                 mask=mask)
        tl.atomic_xchg(counters + column, 0, sem="relaxed", scope="gpu")  # rearmed for the next launch


def takes(rows: int, router_weight: torch.Tensor) -> bool:
    """Whether the joined launch serves these: one row, a contiguous router weight whose column tiles
    fit the counters, enabled."""
    n, hidden = router_weight.shape
    return ENABLED and rows == 1 and router_weight.is_contiguous() and triton.cdiv(n, BLOCK_N) <= TILES \
        and gemm.plan(n, hidden).few.block_m <= 16


def add_zrms_router(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                    router_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x + delta, its zero-centred norm h, ``kernels.gemm.matmul(h, router_weight)``) for one row
    ``x`` [1, width], in one launch (``takes`` says when), with the bits of ``kernels.norm.add_zrms``
    then ``kernels.gemm.matmul``. A wrong shape or dtype raises ValueError naming the input."""
    if x.dim() != 2 or x.shape[0] != 1 or delta.shape != x.shape or weight.shape != (x.shape[1],):
        raise ValueError(f"x {list(x.shape)}, delta {list(delta.shape)} and weight {list(weight.shape)} "
                         "must be [1, width], [1, width] and [width]")
    n, hidden = router_weight.shape
    if hidden != x.shape[1] or router_weight.dtype != x.dtype or not takes(1, router_weight):
        raise ValueError(f"router_weight is {list(router_weight.shape)} {router_weight.dtype}; want [n, "
                         f"{x.shape[1]}] {x.dtype}, contiguous, at most {TILES * BLOCK_N} rows")
    x, delta = x.contiguous(), delta.contiguous()
    total, out = torch.empty_like(x), torch.empty_like(x)
    logits = torch.empty(1, n, dtype=x.dtype, device=x.device)
    plan = gemm.plan(n, hidden)
    block_n = plan.few.block_n if INTERPRETED else BLOCK_N
    tiles = triton.cdiv(n, block_n)
    steps = plan.k_per_segment // plan.few.block_k
    preload = PRELOAD if steps == 4 and plan.k_per_segment % plan.few.block_k == 0 else 0
    partials = torch.empty(plan.segments, n, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(hidden)
    counters = kernels.counters("norm_router", TILES, x.device)
    _norm_router[(tiles * plan.segments,)](
        x, delta, total, out, weight, router_weight, partials, logits, counters, hidden, n, eps,
        plan.k_per_segment, SEGMENTS=plan.segments, TILES=tiles, BLOCK=block, BLOCK_M=plan.few.block_m,
        BLOCK_N=block_n, BLOCK_K=plan.few.block_k, WIDEN=INTERPRETED, PRELOAD=preload,
        EARLY=bool(EARLY) and preload == 4, LATE=not EARLY and preload == 4, num_warps=norm.warps(block),
        num_stages=plan.few.stages, **pdl.options(x.device))
    return total, out, logits


def reference(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
              router_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same from the two launches it joins."""
    total, out = norm.add_zrms(x, delta, weight, eps)
    return total, out, gemm.matmul(out, router_weight)

"""The MoE experts' two launches over tiles of pairs (``tfd_kernels.moe`` plans and launches them): stage one,
a tile's gate/up products and their SwiGLU middle into h (``_gate_up``); stage two, the down products weighted
into the buffer, each term rounded to the model dtype (``_down``), at one row with the combine, the residual
add and the norm in the last program to finish. A program is a tile of pairs and a column tile: the grid's two
axes, or one axis in groups of tiles that walk their columns together. Each tile runs float or FP8 as its
expert's weights are (``tfd_kernels.moe_fp8``). Batch invariance and scratch: ``tfd_kernels.moe``'s.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import gemm, moe_fp8, moe_plan, moe_sum, pdl, runtime


@triton.jit
def _tile_and_column(tiles, GROUP: tl.constexpr):
    """This program's tile of pairs and column tile: the grid's two axes, or with ``GROUP`` one axis
    in which GROUP tiles walk the columns together (their rows and their experts' weight tiles shared
    through L2, as ``tfd_kernels.gemm``'s whole form groups row blocks)."""
    if GROUP == 0:
        return tl.program_id(0), tl.program_id(1)
    return gemm.grouped(tl.program_id(0), tiles, tl.num_programs(0) // tiles, GROUP)


# the grid's tiles follow the pairs of a call: one variant meets them all
@triton.jit(do_not_specialize=["tiles", "count"])
def _gate_up(x, xq, x_scales, gate_up, gate_scales, shared_gate_up, shared_scales, h, layout, pair_at, pairs,
             top_k, experts, hidden, inner, shared_inner, width, stride_x, stride_ge, stride_gn, stride_sn,
             logits, ids, weights, dest_at, tile_expert, tiles, count, BINS: tl.constexpr,
             PRECISION: tl.constexpr, WIDEN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, ONE_ROW: tl.constexpr, K: tl.constexpr, NORM: tl.constexpr,
             BLOCK_E: tl.constexpr, SLOTS: tl.constexpr, FP8: tl.constexpr, SHARED_FP8: tl.constexpr,
             GROUP: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    tile, column = _tile_and_column(tiles, GROUP)
    if ONE_ROW:  # the choice made here, no plan launch before
        expert, _ = moe_plan.chosen_tile(logits, ids, weights, pair_at, dest_at, tile_expert, experts,
                                         tile, column == 0, K, NORM, BLOCK_E, SLOTS, "")
        first, stop = tile, tile + 1
    else:
        expert, first, stop = moe_plan.tile_of(layout, tile, BINS, BLOCK_M)
    size = tl.where(expert == experts, shared_inner, inner)  # the expert's inner size
    if (first >= stop) | (column * BLOCK_N >= size):  # past the last tile, or the expert's columns
        return
    q = first + tl.arange(0, BLOCK_M)
    live = q < stop
    # A routed pair's row from its pair index; the shared group holds one pair a row, in row order.
    if ONE_ROW:
        token = tl.zeros([BLOCK_M], tl.int32)
    else:
        at = tl.load(pair_at + q, mask=live & (q < pairs), other=0)
        token = tl.where(q < pairs, at // top_k, q - pairs)
    moe_fp8.gate_up_of(x, xq, x_scales, gate_up, gate_scales, shared_gate_up, shared_scales, expert, experts,
                       stride_ge, stride_gn, stride_sn, inner, shared_inner, h, q, live, token, count, hidden,
                       width, stride_x, column, PRECISION, WIDEN, BLOCK_M, BLOCK_N, BLOCK_K, FP8, SHARED_FP8)


@triton.jit(do_not_specialize=["tiles"])
def _down(h, hq, h_scales, down, down_scales, shared_down, shared_scales, buf, weights, layout, pair_at,
          dest_at, pairs, experts, hidden, inner, shared_inner, width, stride_de, stride_dn, stride_sn,
          tile_expert, gate, residual, total, normed, norm_weight, stride_g, eps, arrivals, tiles,
          BINS: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr, BLOCK_M: tl.constexpr,
          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ONE_ROW: tl.constexpr, FINISH: tl.constexpr,
          TOP_K: tl.constexpr, SHARED: tl.constexpr, HIDDEN_BLOCK: tl.constexpr, FP8: tl.constexpr,
          SHARED_FP8: tl.constexpr, GROUP: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    tile, column = _tile_and_column(tiles, GROUP)
    if ONE_ROW:  # tile t is pair t, of the expert the first launch wrote
        expert, first, stop = tl.load(tile_expert + tile), tile, tile + 1
    else:
        expert, first, stop = moe_plan.tile_of(layout, tile, BINS, BLOCK_M)
    if first >= stop:
        return
    q = first + tl.arange(0, BLOCK_M)
    live = q < stop
    routed = live & (q < pairs)
    # A shared pair weighs 1, and its buffer row is its grouped position: after every routed pair's.
    weight = tl.load(weights + tl.load(pair_at + q, mask=routed, other=0), mask=routed, other=0.0)
    weight = tl.where(q < pairs, weight.to(tl.float32), 1.0)
    dest = tl.where(q < pairs, tl.load(dest_at + q, mask=routed, other=0), q)
    moe_fp8.down_of(h, hq, h_scales, down, down_scales, shared_down, shared_scales, expert, experts,
                    stride_de, stride_dn, stride_sn, inner, shared_inner, buf, q, live, stop, weight, dest,
                    hidden, width, column, PRECISION, WIDEN, BLOCK_M, BLOCK_N, BLOCK_K, "", FP8, SHARED_FP8)
    if FINISH:  # one row: the last program to finish does _combine_add_zrms' work, in its warps
        tl.debug_barrier()  # every thread's part of the tile is written before it is counted
        programs = tl.num_programs(0) * tl.num_programs(1)
        if tl.atomic_add(arrivals, 1, sem="acq_rel", scope="gpu") == programs - 1:
            moe_sum.combined_add_zrms(buf, gate, residual, total, normed, norm_weight, 0, pairs, hidden,
                                      stride_g, eps, TOP_K, SHARED, HIDDEN_BLOCK, 0)
            tl.atomic_xchg(arrivals, 0, sem="relaxed", scope="gpu")  # rearmed for the next call


def grid(tiles: int, columns: int, group: int) -> tuple[int, ...]:
    """An expert launch's grid: tiles by column tiles, or with ``group`` both on one axis."""
    return (tiles * columns,) if group else (tiles, columns)


def arrivals(device: torch.device) -> torch.Tensor:
    """The device's arrival counter of ``_down`` at one row (its last program rearms it)."""
    return runtime.counters("moe.down", 1, device)

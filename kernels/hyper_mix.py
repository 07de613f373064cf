"""Flash Next's hyper read after its down product, in one launch: ``tfd_kernels.hyper``'s ``gates``, the up
product and ``block_input`` together (``tfd.model.hyper``), the same cast points.

``mix`` takes the down rows' product (and the injection rows'), the up weight and the normalised streams, and
gives the block input and the injection weights. A program takes a block of rows and of columns: each K tile's
hidden values ``silu(p / streams)`` made once for every stream as the up product reads them, fp32 sums over K
in order (a linear's), then each stream's ``sigmoid(up) * normed`` and their mean in stream order.
Decode's few rows take small tiles whose first up weights are asked for before the wait (dependent
launch); a prompt's many rows a tile of their own, or (switches, the same bits) each stream's product
apart, or the three launches.
A row's bits never depend on the others, whatever its tile.

Memory: reads the product, the up weight (a tile's rows for each row block) and the streams once a column
block; writes the block input and the weights. Grids follow shapes only (CUDA graphs capture decode's).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import gemm, pdl
from tfd_kernels.conv1d import silu_out
from tfd_kernels.hyper import block_input, divided, gates, injection, unit_columns
from tfd_kernels.runtime import INTERPRETED
from tfd_kernels.sigmoid_gate import gated


@triton.jit
def _up_tile(up, stream_of, cols_of, start, rank, width, stride_u, BLOCK_K: tl.constexpr):
    """The up rows of the streams' side-by-side columns at K tile ``start`` (zeros past rank, width)."""
    ks = start + tl.arange(0, BLOCK_K)
    return tl.load(up + (stream_of * width + cols_of)[:, None] * stride_u + ks[None, :],
                   mask=(cols_of[:, None] < width) & (ks[None, :] < rank), other=0.0)


@triton.jit
def _hidden(projected, rows, rows_n, start, rank, stride_p, streams, dtype: tl.constexpr,
            BLOCK_K: tl.constexpr):
    """The mix's hidden values ``silu(p / streams)`` of ``rows`` at K tile ``start`` (zeros past rank)."""
    ks = start + tl.arange(0, BLOCK_K)
    p = tl.load(projected + rows[:, None] * stride_p + ks[None, :],
                mask=(rows[:, None] < rows_n) & (ks[None, :] < rank), other=0.0)
    return silu_out(divided(p, streams, dtype), dtype)


@triton.jit
def _store_injection(projected, weights, rows, rows_n, tile_c, rank, stride_p, streams, dtype: tl.constexpr,
                     STREAMS: tl.constexpr):
    """The injection weights ``2 * sigmoid(p / streams)`` of ``rows``, written by the first column block."""
    which = tl.arange(0, STREAMS)
    mine = rows[:, None] < tl.where(tile_c == 0, rows_n, 0)
    p = tl.load(projected + rows[:, None] * stride_p + rank + which[None, :], mask=mine, other=0.0)
    injected = injection(divided(p, streams, dtype), dtype)
    tl.store(weights + rows[:, None] * STREAMS + which[None, :], injected, mask=mine)


@triton.jit
def _mix_step(projected, b, acc, rows, rows_n, start, rank, stride_p, streams, dtype: tl.constexpr,
              BLOCK_K: tl.constexpr, WIDEN: tl.constexpr):
    """``acc`` plus the hidden values of K tile ``start`` (made once for every stream) times ``b``."""
    hidden = _hidden(projected, rows, rows_n, start, rank, stride_p, streams, dtype, BLOCK_K)
    if WIDEN:
        hidden, b = hidden.to(tl.float32), b.to(tl.float32)
    return tl.dot(hidden, tl.trans(b), acc, input_precision="ieee")


@triton.jit
def _early_step(projected, b, acc, tile: tl.constexpr, rows, rows_n, rank, stride_p, streams,
                dtype: tl.constexpr, BLOCK_K: tl.constexpr, WIDEN: tl.constexpr):
    """``acc`` plus K tile ``tile`` (its up rows ``b`` asked for early) where it starts before rank,
    as the loop would have added it; else ``acc``."""
    if tile * BLOCK_K < rank:
        acc = _mix_step(projected, b, acc, rows, rows_n, tile * BLOCK_K, rank, stride_p, streams, dtype,
                        BLOCK_K, WIDEN)
    return acc


@triton.jit
def _mix(projected, up, normed, out, weights, rows_n, rank, width, stride_p, stride_u, stride_n, streams,
         STREAMS: tl.constexpr, INJECTS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
         BLOCK_K: tl.constexpr, WIDEN: tl.constexpr, EARLY: tl.constexpr, REST: tl.constexpr,
         PDL: tl.constexpr):
    """A program a block of rows and of columns: ``_gates``' hidden values for its rows, K tile by K
    tile, times the up rows of its columns in every stream at once (column j of the product is
    stream j // BLOCK_C's; fp32 sums over K in order, rounded as a linear's); ``_block_input``'s
    mean of the gated streams, added in stream order. The first column block writes the injection.
    ``EARLY``: the first EARLY (up to 5) K tiles' up rows (weights no kernel writes) asked for before
    the wait; ``REST``: where the loop's tiles start (the first past them)."""
    tile_c, tile_r = tl.program_id(0), tl.program_id(1)
    rows = tile_r * BLOCK_R + tl.arange(0, BLOCK_R)
    side = tl.arange(0, STREAMS * BLOCK_C)  # the streams' columns side by side
    stream_of = side // BLOCK_C
    cols_of = tile_c * BLOCK_C + side % BLOCK_C
    dtype = out.dtype.element_ty
    f1, f2, f3, f4 = up, up, up, up  # unread unless asked for below
    if EARLY:
        first = _up_tile(up, stream_of, cols_of, 0, rank, width, stride_u, BLOCK_K)
        if EARLY > 1:  # zeros past rank, never added (below)
            f1 = _up_tile(up, stream_of, cols_of, BLOCK_K, rank, width, stride_u, BLOCK_K)
        if EARLY > 2:
            f2 = _up_tile(up, stream_of, cols_of, 2 * BLOCK_K, rank, width, stride_u, BLOCK_K)
        if EARLY > 3:
            f3 = _up_tile(up, stream_of, cols_of, 3 * BLOCK_K, rank, width, stride_u, BLOCK_K)
        if EARLY > 4:
            f4 = _up_tile(up, stream_of, cols_of, 4 * BLOCK_K, rank, width, stride_u, BLOCK_K)
    pdl.wait(PDL)
    if not EARLY:
        first = _up_tile(up, stream_of, cols_of, 0, rank, width, stride_u, BLOCK_K)
    acc = _mix_step(projected, first, tl.zeros((BLOCK_R, STREAMS * BLOCK_C), tl.float32), rows, rows_n, 0,
                    rank, stride_p, streams, dtype, BLOCK_K, WIDEN)
    if EARLY > 1:  # the tiles asked for early, in order
        acc = _early_step(projected, f1, acc, 1, rows, rows_n, rank, stride_p, streams, dtype, BLOCK_K, WIDEN)
    if EARLY > 2:
        acc = _early_step(projected, f2, acc, 2, rows, rows_n, rank, stride_p, streams, dtype, BLOCK_K, WIDEN)
    if EARLY > 3:
        acc = _early_step(projected, f3, acc, 3, rows, rows_n, rank, stride_p, streams, dtype, BLOCK_K, WIDEN)
    if EARLY > 4:
        acc = _early_step(projected, f4, acc, 4, rows, rows_n, rank, stride_p, streams, dtype, BLOCK_K, WIDEN)
    for start in range(REST, rank, BLOCK_K):  # the rest in order, as the first
        b = _up_tile(up, stream_of, cols_of, start, rank, width, stride_u, BLOCK_K)
        acc = _mix_step(projected, b, acc, rows, rows_n, start, rank, stride_p, streams, dtype, BLOCK_K,
                        WIDEN)
    value = tl.load(normed + rows[:, None] * stride_n + (stream_of * width + cols_of)[None, :],
                    mask=(rows[:, None] < rows_n) & (cols_of[None, :] < width), other=0.0)
    each = tl.reshape(gated(value, acc.to(dtype), dtype).to(tl.float32), (BLOCK_R, STREAMS, BLOCK_C))
    which = tl.arange(0, STREAMS)[None, :, None]
    total = tl.zeros((BLOCK_R, BLOCK_C), tl.float32)
    for stream in tl.static_range(STREAMS):  # in stream order, as the mean adds them (the rest are zeros)
        total += tl.sum(tl.where(which == stream, each, 0.0), axis=1)
    cols = tile_c * BLOCK_C + tl.arange(0, BLOCK_C)
    live = (rows[:, None] < rows_n) & (cols[None, :] < width)
    tl.store(out + rows[:, None] * width + cols[None, :], (total / STREAMS).to(dtype), mask=live)
    if INJECTS:
        _store_injection(projected, weights, rows, rows_n, tile_c, rank, stride_p, streams, dtype, STREAMS)


@triton.jit
def _mix_apart(projected, up, up_tiles, normed, out, weights, rows_n, rank, width, stride_p, stride_u,
               stride_n, streams, STREAMS: tl.constexpr, INJECTS: tl.constexpr, BLOCK_R: tl.constexpr,
               BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, WIDEN: tl.constexpr, TMA: tl.constexpr,
               PDL: tl.constexpr):
    """``_mix`` with each stream's product its own accumulator (up to 4 streams): a K tile's hidden
    values made once and multiplied by each stream's up rows in turn, so the mean adds the streams' gated
    values as they are, without regrouping one product's columns by stream. The same sums in the same
    order, the same cast points. ``TMA``: the up rows read through the tensor descriptor ``up_tiles``
    (a tile's rows past the width are the next stream's, whose columns are never stored; past the last
    row and the rank, zeros), without the 64-bit address a loaded element that pointer loads hold."""
    pdl.wait(PDL)
    tile_c, tile_r = tl.program_id(0), tl.program_id(1)
    rows = tile_r * BLOCK_R + tl.arange(0, BLOCK_R)
    first = tile_c * BLOCK_C
    cols = first + tl.arange(0, BLOCK_C)
    dtype = out.dtype.element_ty
    a0 = tl.zeros((BLOCK_R, BLOCK_C), tl.float32)
    a1, a2, a3 = a0, a0, a0  # unused past STREAMS
    for start in range(0, rank, BLOCK_K):
        hidden = _hidden(projected, rows, rows_n, start, rank, stride_p, streams, dtype, BLOCK_K)
        a0 = _stream_dot(hidden, up, up_tiles, 0, cols, first, start, rank, width, stride_u, a0, BLOCK_K,
                         WIDEN, TMA)
        if STREAMS > 1:
            a1 = _stream_dot(hidden, up, up_tiles, 1, cols, first, start, rank, width, stride_u, a1, BLOCK_K,
                             WIDEN, TMA)
        if STREAMS > 2:
            a2 = _stream_dot(hidden, up, up_tiles, 2, cols, first, start, rank, width, stride_u, a2, BLOCK_K,
                             WIDEN, TMA)
            a3 = _stream_dot(hidden, up, up_tiles, 3, cols, first, start, rank, width, stride_u, a3, BLOCK_K,
                             WIDEN, TMA)
    live = (rows[:, None] < rows_n) & (cols[None, :] < width)
    total = _gated_stream(normed, a0, 0, rows, cols, live, width, stride_n, dtype)  # in stream order
    if STREAMS > 1:
        total += _gated_stream(normed, a1, 1, rows, cols, live, width, stride_n, dtype)
    if STREAMS > 2:
        total += _gated_stream(normed, a2, 2, rows, cols, live, width, stride_n, dtype)
        total += _gated_stream(normed, a3, 3, rows, cols, live, width, stride_n, dtype)
    tl.store(out + rows[:, None] * width + cols[None, :], (total / STREAMS).to(dtype), mask=live)
    if INJECTS:
        _store_injection(projected, weights, rows, rows_n, tile_c, rank, stride_p, streams, dtype, STREAMS)


@triton.jit
def _stream_dot(hidden, up, up_tiles, stream, cols, first, start, rank, width, stride_u, acc,
                BLOCK_K: tl.constexpr, WIDEN: tl.constexpr, TMA: tl.constexpr):
    """``acc`` plus K tile ``start``'s hidden values times ``stream``'s up rows of columns ``cols`` (by
    the descriptor ``up_tiles`` with ``TMA``: a tile from column ``first``)."""
    if TMA:
        b = up_tiles.load([stream * width + first, start])
    else:
        b = _up_tile(up, stream, cols, start, rank, width, stride_u, BLOCK_K)
    if WIDEN:
        return tl.dot(hidden.to(tl.float32), tl.trans(b.to(tl.float32)), acc, input_precision="ieee")
    return tl.dot(hidden, tl.trans(b), acc, input_precision="ieee")


@triton.jit
def _gated_stream(normed, acc, stream, rows, cols, live, width, stride_n, dtype: tl.constexpr):
    """``stream``'s ``sigmoid(up) * normed`` at ``rows`` x ``cols`` from its product's sums, in fp32."""
    at = rows[:, None] * stride_n + (stream * width + cols)[None, :]
    value = tl.load(normed + at, mask=live, other=0.0)
    return gated(value, acc.to(dtype), dtype).to(tl.float32)


# A mix program's rows by the rows of the call, (rows up to, row tile), and its columns a stream, MIX_COLUMNS;
# past the last bound a prompt's tile. Decode's few rows over 320 programs (one row's 6.6 MB of up weights; 80
# programs of 32 columns, each walking the streams in turn, took 12.6 us on the H200; 16 columns 7.5 us).
# With all five K tiles asked for early (MIX_EARLY), 8 columns beat 16 (H100, Flash Next one stream, 8 of 48
# layers, best of three: 1.7377 ms a step against 1.7618; 1.7933 with neither); a prompt's many rows read
# each weight tile for 64 of them. An element's sum over K is in the same order whatever its tile.
# MIX_COLUMNS an int, so that tfd bench --variant can sweep it.
MIX_TILES = ((16, 16), (64, 32))
MIX_COLUMNS = 8
# A prompt's tile (rows, columns a stream) and its launch's warps and pipeline depth: ints, so that tfd bench
# --variant can sweep them (Flash Next's 1,024-row prefill: 17 mixes of 85 us on the H100, its product's
# 6.7 GFLOP worth 9 us at the matmul rate; unswept).
MIX_PROMPT_ROWS, MIX_PROMPT_COLUMNS = 64, 32
MIX_PROMPT_WARPS, MIX_PROMPT_STAGES = 4, 3
MIX_K = 64
# K tiles of up weights (0 to MOST_EARLY) a decode mix asks for before it waits on the down product (dependent
# launch): timing alone, the same bits. Flash Next's rank of 320 is five tiles of 64, all of a program's
# weights: H100, one stream, 8 of 48 layers, tfd bench --variant (best of three, 2026-12-07): 1.7618 ms a step
# against 1.7933 without (one tile 1.7800). A prompt's mix asks for none: its 1 x 1,024 prefill took 30.4 ms
# with five against 29.5.
MIX_EARLY = 5
MOST_EARLY = 5  # tiles _mix holds for it (first, f1 .. f4)
# A prompt's mix as the three launches it fuses (gates, the batch-invariant up product, block_input; the same
# cast points and bits) instead of one. H100, alone under a CUDA graph: 44.7 us against 89.3 at 1,024 rows,
# 162 against 316 at 4,096; but Flash Next's one-lane prefill waits on the host, where its two more launches
# and a product cost more than the device saves (tfd bench, four rounds: ~46 ms against ~40; docs/bench.md,
# forty-fifth session). Off until the prompt pass's launches stop setting its pace. An int, so that tfd
# bench --variant can time it (0: one launch).
MIX_PROMPT_SPLIT = 0
# A prompt's mix by _mix_apart (each stream its own product; up to 4 streams), in tiles of MIX_APART_COLUMNS
# columns a stream: timing alone, the same bits. H100, alone under a CUDA graph (2026-12-07,
# hyper_prompt_sweep.py): Flash Next's 1,024 rows 60.2 us against the one launch's 88.9 (32 columns 82.4, 64
# at 8 warps 65.2), 4,096 rows 191.9 against 314.2. Ints, so that tfd bench --variant can time them (0: the
# one launch).
MIX_PROMPT_APART = 1
MIX_APART_COLUMNS = 64


def _prompt(rows: int) -> bool:
    """Whether a mix over ``rows`` rows takes the prompt's tile and launch: more rows than other tiles'."""
    return rows > MIX_TILES[-1][0]


def _apart(rows: int, streams: int) -> bool:
    """Whether a mix over ``rows`` rows of ``streams`` streams takes ``_mix_apart`` (``MIX_PROMPT_APART``)."""
    return bool(MIX_PROMPT_APART) and _prompt(rows) and streams <= 4


def mix_tile(rows: int, streams: int) -> tuple[int, int]:
    """The (row tile, columns a stream) of a mix over ``rows`` rows of ``streams`` streams."""
    if _prompt(rows):
        return MIX_PROMPT_ROWS, MIX_APART_COLUMNS if _apart(rows, streams) else MIX_PROMPT_COLUMNS
    return next(tile for most, tile in MIX_TILES if rows <= most), MIX_COLUMNS


def _mix_launch(rows: int) -> dict[str, int]:
    """A mix's warps and pipeline depth over ``rows`` rows: a prompt's its own, else Triton's defaults."""
    return {"num_warps": MIX_PROMPT_WARPS, "num_stages": MIX_PROMPT_STAGES} if _prompt(rows) else {}


def _up_described(up: torch.Tensor, block_c: int) -> object | None:
    """A tensor descriptor of ``up``'s [block_c, MIX_K] tiles where TMA can read it, else None
    (``tfd_kernels.gemm.described``)."""
    return gemm.described(up, [block_c, MIX_K])


def mix(projected: torch.Tensor, up: torch.Tensor, normed: torch.Tensor, streams: int, width: int
        ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``gates`` then the up product then ``block_input`` in one launch: from ``projected`` [rows,
    rank (+ streams)] (the down rows' product, then the injection rows'), ``up`` [streams * width,
    rank] and the normalised streams ``normed`` [rows, streams * width], the block input [rows,
    width] and the injection weights [rows, streams] (None without injection rows). A prompt's rows
    take the three launches instead where ``MIX_PROMPT_SPLIT`` says, or each stream's product apart
    (``_mix_apart``, up to 4 streams) where ``MIX_PROMPT_APART`` does: the same bits either way."""
    rank = up.shape[1] if up.dim() == 2 else 0
    rows = projected.shape[0]
    if projected.dim() != 2 or projected.shape[1] not in (rank, rank + streams) \
            or up.shape != (streams * width, rank) or normed.shape != (rows, streams * width) \
            or streams & (streams - 1):
        raise ValueError(f"projected {list(projected.shape)}, up {list(up.shape)}, normed "
                         f"{list(normed.shape)} for {streams} streams of {width}: want [rows, rank (+ "
                         "streams)], [streams * width, rank], [rows, streams * width], streams a power of 2")
    projected, up, normed = unit_columns(projected), unit_columns(up), unit_columns(normed)
    injects = projected.shape[1] > rank
    if MIX_PROMPT_SPLIT and _prompt(rows):
        mixed, weights = gates(projected, rank, streams)
        return block_input(gemm.matmul(mixed, up), normed, streams, width), weights
    out = torch.empty(rows, width, dtype=normed.dtype, device=normed.device)
    weights = torch.empty(rows, streams, dtype=normed.dtype, device=normed.device) if injects else None
    if rows:
        block_r, block_c = mix_tile(rows, streams)
        if _apart(rows, streams):
            tiles = _up_described(up, block_c)
            _mix_apart[(triton.cdiv(width, block_c), triton.cdiv(rows, block_r))](
                projected, up, up if tiles is None else tiles, normed, out,
                out if weights is None else weights, rows, rank, width, projected.stride(0), up.stride(0),
                normed.stride(0), float(streams),
                STREAMS=streams, INJECTS=injects, BLOCK_R=block_r, BLOCK_C=block_c, BLOCK_K=MIX_K,
                WIDEN=INTERPRETED, TMA=tiles is not None, **_mix_launch(rows), **pdl.options(normed.device))
            return out, weights
        early = 0 if _prompt(rows) else min(MIX_EARLY, MOST_EARLY)
        _mix[(triton.cdiv(width, block_c), triton.cdiv(rows, block_r))](
            projected, up, normed, out, out if weights is None else weights, rows, rank, width,
            projected.stride(0), up.stride(0), normed.stride(0), float(streams), STREAMS=streams,
            INJECTS=injects, BLOCK_R=block_r, BLOCK_C=block_c, BLOCK_K=MIX_K, WIDEN=INTERPRETED,
            EARLY=early, REST=max(early, 1) * MIX_K, **_mix_launch(rows), **pdl.options(normed.device))
    return out, weights

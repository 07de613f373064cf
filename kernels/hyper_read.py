"""Flash Next's hyper read at a decode step's few rows in one launch: the streams' write and norm
(``tfd_kernels.hyper.write_norm``), the read's down product (``tfd_kernels.gemm``'s spread form) and
its mix (``tfd_kernels.hyper.mix``), with the bits of those launches one after another.

A one-stream decode step runs 33 reads of a few microseconds of bytes each (two 6.6 MB weights), and
each of the three launches waited out the one before (H200: ~2 + 7.8 + 7.5 us a read). Here the
launch's programs take roles by index: the writers (a row and stream each, ``write_norm_row``), then
the down product's programs (a column tile and K segment each, ``gemm.segment_sum_early``; each tile's
last program adds the fp32 partials in segment order and stores the product rounded, as the spread
form does), then the mix's (a column tile each, ``hyper.mix_program``). A down program waits for every
writer (``WRITTEN``), a mix program for every down tile (``DOWN``); both ask for their first weights
before waiting. Waiting inside a launch needs the programs waited on to run: GPUs start a launch's
programs in order of their index and every program waits only on programs of lower index
(``tfd_kernels.moe_one`` relies on the same); the interpreter runs programs in order. Each program
counts after a barrier and its stores (release) and reads what others stored after the count that
saw theirs (acquire). The last mix program past its wait rearms the counters.

Warps: with the write, the norm's (``tfd_kernels.norm.warps``), so its squares are summed in that
order; a product's bits are the same in 4 or 8 warps (``tfd_kernels.gemm``; the GPU test checks the
whole launch against the three). Scratch: the product's fp32 partials and its rounded result, freed
on return; the device's counters (zero between launches; reads run one at a time on a stream).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import gemm, gemm_plan, hyper, pdl, runtime
from tfd_kernels import norm as norm_kernels
from tfd_kernels.runtime import INTERPRETED

# Rows up to which a read may run in one launch: one row tile of the down product (gemm_plan's few-row
# tile) and of the mix (hyper.MIX_TILES' first).
READ_ROWS = 16
# A decode read's launches: 3 (the write and norm, the down product, the mix, each its own), 2 (the
# write and norm, then the product and the mix in one) or 1 (all in one). An int, so that tfd bench
# --variant can sweep it; 3 until a GPU has timed the others.
LAUNCHES = 3
DOWN_EARLY = 1  # K steps of weights a down program asks for before it waits (0 to gemm.MOST_EARLY)
STAGES = 3  # the launch's pipeline depth (the product's K loop and the mix's)
# the counters (constexprs: the kernels read them): writers, down tiles, mix programs; the tiles' arrivals
WRITTEN, DOWN, MIXED, TILES = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2), tl.constexpr(3)
MOST_TILES = 64  # the down product's column tiles at most


@triton.jit
def _await(counter, count):
    """Return once ``counter`` has reached ``count`` (acquire: what was stored before it shows)."""
    while tl.atomic_add(counter, 0, sem="acquire", scope="gpu") < count:
        pass


@triton.jit
def _down(normed, w, partials, projected, counters, program, writers, rows_n, n, k, k_per_segment,
          stride_n, stride_w, stride_ps, WRITES: tl.constexpr, SEGMENTS: tl.constexpr, N_TILES: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WIDEN: tl.constexpr,
          EARLY: tl.constexpr, PDL: tl.constexpr):
    """A down program: its column tile's K segment, as ``gemm._spread`` makes it (fp32 partial
    stored, counted; the tile's last program adds all in segment order and stores them rounded)."""
    tile, segment = program % N_TILES, program // N_TILES
    rows = tl.arange(0, BLOCK_M)
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    start = segment * k_per_segment
    b0, b1, b2, b3 = w, w, w, w  # unread unless asked for below
    if EARLY:  # weights no kernel writes: they come while the writers run
        b0 = gemm.weight_tile(w, cols, n, k, start, stride_w, BLOCK_K)
        if EARLY > 1:
            b1 = gemm.weight_tile(w, cols, n, k, start + BLOCK_K, stride_w, BLOCK_K)
        if EARLY > 2:
            b2 = gemm.weight_tile(w, cols, n, k, start + 2 * BLOCK_K, stride_w, BLOCK_K)
        if EARLY > 3:
            b3 = gemm.weight_tile(w, cols, n, k, start + 3 * BLOCK_K, stride_w, BLOCK_K)
    pdl.wait(PDL)
    if WRITES:
        _await(counters + WRITTEN, writers)
    acc = gemm.segment_sum_early(normed, w, b0, b1, b2, b3, rows, cols, rows_n, n, k, start, k_per_segment,
                                 stride_n, stride_w, BLOCK_M, BLOCK_N, BLOCK_K, WIDEN, EARLY)
    mask = (rows[:, None] < rows_n) & (cols[None, :] < n)
    where = rows[:, None] * n + cols[None, :]
    tl.store(partials + segment * stride_ps + where, acc, mask=mask)
    tl.debug_barrier()  # every thread's part of the partial is written before it is counted
    arrivals = counters + TILES + tile
    if tl.atomic_add(arrivals, 1, sem="acq_rel", scope="gpu") == SEGMENTS - 1:
        total = gemm.summed(partials, stride_ps, where, mask, SEGMENTS).to(projected.dtype.element_ty)
        tl.store(projected + where, total, mask=mask)
        tl.atomic_xchg(arrivals, 0, sem="relaxed", scope="gpu")  # every segment of the tile counted
        tl.debug_barrier()  # the tile stored before it is counted
        tl.atomic_add(counters + DOWN, 1, sem="release", scope="gpu")


@triton.jit(do_not_specialize=["rows_n"])
def _read(stack, output, scale, norm, written, normed, w, partials, projected, up, out, weights, counters,
          rows_n, width, rank, n, k, k_per_segment, stride_s, stride_o, stride_sc, stride_n, stride_w,
          stride_ps, stride_u, eps, streams, STREAMS: tl.constexpr, WRITES: tl.constexpr,
          INJECTS: tl.constexpr, NORM_BLOCK: tl.constexpr, SEGMENTS: tl.constexpr, N_TILES: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
          BLOCK_C: tl.constexpr, MIX_K: tl.constexpr, WIDEN: tl.constexpr, DOWN_EARLY: tl.constexpr,
          EARLY: tl.constexpr, REST: tl.constexpr, PDL: tl.constexpr):
    program = tl.program_id(0)
    writers = rows_n * 0
    if WRITES:
        writers += rows_n * STREAMS
    downs = writers + N_TILES * SEGMENTS
    if program < writers:
        pdl.wait(PDL)
        row, stream = program // STREAMS, program % STREAMS
        hyper.write_norm_row(stack, output, scale, norm, written, normed, row, stream, STREAMS, width,
                             stride_s, stride_o, stride_sc, eps, NORM_BLOCK)
        tl.debug_barrier()  # every thread's stores are done before they are counted
        tl.atomic_add(counters + WRITTEN, 1, sem="release", scope="gpu")
    elif program < downs:
        _down(normed, w, partials, projected, counters, program - writers, writers, rows_n, n, k,
              k_per_segment, stride_n, stride_w, stride_ps, WRITES, SEGMENTS, N_TILES, BLOCK_M, BLOCK_N,
              BLOCK_K, WIDEN, DOWN_EARLY, PDL)
    else:
        tile_c = program - downs
        first, f1, f2, f3, f4 = hyper.mix_early(up, tile_c, rank, width, stride_u, STREAMS, BLOCK_C, MIX_K,
                                                EARLY)
        pdl.wait(PDL)
        _await(counters + DOWN, N_TILES)
        mixers = tl.num_programs(0) - downs
        if tl.atomic_add(counters + MIXED, 1, sem="relaxed", scope="gpu") == mixers - 1:
            # every program has passed its waits: the counters they waited on rearmed for the next launch
            tl.atomic_xchg(counters + WRITTEN, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(counters + DOWN, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(counters + MIXED, 0, sem="relaxed", scope="gpu")
        hyper.mix_program(projected, up, normed, out, weights, first, f1, f2, f3, f4, tile_c, 0, rows_n, rank,
                          width, n, stride_u, stride_n, streams, STREAMS, INJECTS, BLOCK_R, BLOCK_C, MIX_K,
                          WIDEN, EARLY, REST)


def fits(rows: int, streams: int, projections: object, up: object) -> bool:
    """Whether a read of ``rows`` rows can run in one launch: few rows, streams a power of two, and
    both products' weights plain float tensors of one dtype (not FP8, not joined parts)."""
    if not (0 < rows <= READ_ROWS and streams > 0 and not streams & (streams - 1)):
        return False
    tensors = isinstance(projections, torch.Tensor) and isinstance(up, torch.Tensor)
    return tensors and projections.dtype == up.dtype and projections.is_floating_point() \
        and projections.element_size() > 1


def mixed(normed: torch.Tensor, projections: torch.Tensor, up: torch.Tensor, streams: int, width: int
          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``hyper.mix(gemm.matmul(normed, projections), up, normed, streams, width)`` in one launch:
    the block input [rows, width] and the injection weights [rows, streams] (None without
    injection rows), from the normalised streams [rows, streams * width]."""
    _check(normed.shape[0], projections, up, normed, streams, width)
    normed = hyper.unit_columns(normed)
    return _launch(normed, normed, None, projections, up, streams, width)[1:]


def written_mixed(stack: torch.Tensor, output: torch.Tensor, scale: torch.Tensor, norm: torch.Tensor,
                  eps: float, projections: torch.Tensor, up: torch.Tensor, streams: int, width: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``hyper.write_norm(stack, output, scale, norm, eps)`` then ``mixed`` of its norm, in one
    launch: (the written streams, the block input, the injection weights)."""
    rows, _, _ = hyper.write_shapes(stack, output, scale, norm)
    _check(rows, projections, up, stack, streams, width)
    stack, output, scale = hyper.unit_columns(stack), hyper.unit_columns(output), hyper.unit_columns(scale)
    normed = torch.empty(rows, streams * width, dtype=stack.dtype, device=stack.device)
    return _launch(stack, normed, (output, scale, norm, eps), projections, up, streams, width)


def _check(rows: int, projections: torch.Tensor, up: torch.Tensor, streams_in: torch.Tensor, streams: int,
           width: int) -> None:
    """ValueError naming the inputs unless ``fits`` and their shapes agree."""
    rank = up.shape[1] if up.dim() == 2 else 0
    if not fits(rows, streams, projections, up) or projections.dim() != 2 \
            or projections.shape != (projections.shape[0], streams * width) \
            or projections.shape[0] not in (rank, rank + streams) or up.shape != (streams * width, rank) \
            or streams_in.shape != (rows, streams * width):
        raise ValueError(f"projections {list(projections.shape)}, up {list(up.shape)}, streams "
                         f"{list(streams_in.shape)} for {streams} streams of {width}: want [rank (+ "
                         f"streams), streams * width], [streams * width, rank], [1 to {READ_ROWS} rows, "
                         "streams * width] of one float dtype, streams a power of 2")


Write = tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]  # the block's output, its scale, the norm, eps


def _launch(stack: torch.Tensor, normed: torch.Tensor, write: Write | None, projections: torch.Tensor,
            up: torch.Tensor, streams: int, width: int
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The launch: with ``write`` (output, scale, norm, eps) the writers make ``stack``'s written
    streams and their norm into ``normed``; without, ``normed`` is read as it is."""
    rows = stack.shape[0]
    n, k = projections.shape
    rank = up.shape[1]
    projections, up = hyper.unit_columns(projections), hyper.unit_columns(up)
    choice = gemm_plan.plan(n, k)
    tiles = choice.spread_tiles(rows)
    n_tiles = triton.cdiv(n, tiles.block_n)
    block_r, block_c = hyper.mix_tile(rows)
    if tiles.block_m < rows or block_r < rows or n_tiles > MOST_TILES:
        raise ValueError(f"a read of {rows} rows into {n} columns: more than one row tile, or {MOST_TILES} "
                         "column tiles")
    written = torch.empty_like(normed) if write is not None else stack
    projected = torch.empty(rows, n, dtype=normed.dtype, device=normed.device)
    partials = torch.empty(choice.segments, rows, n, dtype=torch.float32, device=normed.device)
    out = torch.empty(rows, width, dtype=normed.dtype, device=normed.device)
    injects = n > rank
    weights = torch.empty(rows, streams, dtype=normed.dtype, device=normed.device) if injects else None
    output, scale, norm, eps = write if write is not None else (stack, stack, stack, 0.0)
    norm_block = triton.next_power_of_2(width)
    warps = norm_kernels.warps(norm_block) if write is not None else tiles.warps
    early = min(hyper.MIX_EARLY, hyper.MOST_EARLY)
    writers = rows * streams if write is not None else 0
    counters = runtime.counters("hyper_read", TILES.value + MOST_TILES, stack.device)
    grid = (writers + n_tiles * choice.segments + triton.cdiv(width, block_c),)
    _read[grid](stack, output, scale, norm, written, normed, projections, partials, projected, up, out,
                out if weights is None else weights, counters, rows, width, rank, n, k, choice.k_per_segment,
                stack.stride(0), output.stride(0), scale.stride(0), normed.stride(0), projections.stride(0),
                partials.stride(0), up.stride(0), eps, float(streams), STREAMS=streams,
                WRITES=write is not None, INJECTS=injects, NORM_BLOCK=norm_block, SEGMENTS=choice.segments,
                N_TILES=n_tiles, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
                BLOCK_R=block_r, BLOCK_C=block_c, MIX_K=hyper.MIX_K, WIDEN=INTERPRETED,
                DOWN_EARLY=min(DOWN_EARLY, choice.k_per_segment // tiles.block_k, gemm.MOST_EARLY),
                EARLY=early, REST=max(early, 1) * hyper.MIX_K, num_warps=warps, num_stages=STAGES,
                **pdl.options(stack.device))
    return written, out, weights

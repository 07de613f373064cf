"""The MoE expert tiles with block-wise FP8 weights (``tfd_kernels.moe``, ``tfd_kernels.moe_one``), and the
choice of a tile's kind: ``gate_up_of`` and ``down_of`` run a tile of a routed expert or of the shared
expert, float (``tfd_kernels.moe_tiles``, unchanged) or FP8 as that expert's weights are, so the routed
experts and the shared expert may each be either.

An FP8 product is ``tfd.model.fp8.linear``'s math by ``tfd_kernels.fp8_gemm``'s code. The input rows (x for
gate/up; for down the middle h, already rounded to the model dtype) are quantized per row and 128-wide block
once, before the tiles that read them (``fp8_gemm.quantized``: max |v| / 448, a correctly rounded division, a
clamp to +-448, the e4m3 cast): x by ``fp8_gemm.quantize`` before the gate/up launch; h by
``quantize_middles`` between the two launches (each row over its own expert's inner size: h's rows are as wide
as the wider expert's, the narrower one's columns past its size never written), or in the one launch by each
tile's last gate/up program (``tfd_kernels.moe_one``). A tile loads e4m3 rows and their scales
(``rows_block``): a column tile does not quantize its rows again (at decode 64 padded rows x the K size in
divisions every column tile, more time than reading the FP8 weights). Each K step is one 128-wide block: the
block's fp8 dot from zero in fp32, times (the row's scale * the weight's scale for the column's 128-row block
at this K block), the scales multiplied first; the blocks' terms added in ascending K order from the first
block's, in fp32. A fused gate_up keeps its rows' places, so an up row's scale is the one of its block among
all 2 * inner rows (where inner is not a multiple of 128 a block holds gate and up rows). Then the tile goes
on exactly as the float one does: the same SwiGLU middle and store (``moe_tiles.store_middle``), the same
weighted store.

Rounding on the GPU: a block's term is multiplied by ``mul.rn.f32`` (inline PTX), which no compiler
contracts into an fma with the add after it, so the launches keep their compile options and their float
epilogues (norms included) compile as before. Every FP8 tile is ``tfd_kernels.moe.FP8_M`` = 64 pairs, a
warp group's wgmma rows as in fp8_gemm, so every path multiplies with the same fp8 instructions, whose
in-block accumulation is the tensor cores' (not fp32's correctly rounded sum, the same for every tile).
Interpreted (``WIDEN``, as everywhere in these kernels), numpy multiplies and adds apart and the casts are
fp8_gemm's exact ones.

Batch invariance: a pair's quantization and products read its own row alone, in steps fixed by the weight
shapes; nothing depends on the other pairs of its tile or on their number. Scratch (the launchers'): the
quantized rows of x and h (a byte an element) and their fp32 scales (one a row and 128-wide block).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import fp8_gemm, moe_tiles, pdl
from tfd_kernels.gemm import weight_tile
from tfd_kernels.runtime import INTERPRETED

STEP = tl.constexpr(fp8_gemm.BLOCK)  # an FP8 tile's K step: the activation group and the weight's scale block
QUANTIZE_ROWS = fp8_gemm.QUANTIZE_ROWS  # middles a ``quantize_middles`` program quantizes


@triton.jit
def blocks(n):
    """The scale blocks covering ``n`` rows or columns."""
    return (n + STEP - 1) // STEP


@triton.jit
def scales_of(routed, shared, expert, experts, per_expert):
    """An expert's scales: the shared expert's (id ``experts``), else the routed expert's, ``per_expert``
    apart (scales contiguous)."""
    return tl.where(expert == experts, shared, routed + expert.to(tl.int64) * per_expert)


@triton.jit
def _term(q, b, q_scale, w_scale, INTERPRETED: tl.constexpr):
    """A K block's fp32 dot from zero times (row scale * column scale), the scales multiplied first."""
    dot = tl.dot(q, tl.trans(b), out_dtype=tl.float32)
    factor = q_scale[:, None] * w_scale[None, :]
    if INTERPRETED:  # numpy rounds each product before any add
        return dot * factor
    # mul.rn (no ftz): never contracted into an fma with the add that follows, subnormals kept
    return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [dot, factor], dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def rows_block(q, scales, rows, m, k, start, width):
    """K block ``start`` of quantized rows ``rows`` (those below ``m``, columns below ``k``): their e4m3
    values from ``q`` [.., width] and fp32 scales from ``scales`` [.., blocks(width)], both contiguous
    (``fp8_gemm.quantize``'s layout). A masked row reads zeros and scale 1, as its quantization gave."""
    ks = start + tl.arange(0, STEP)
    values = tl.load(q + rows[:, None] * width + ks[None, :], mask=(rows[:, None] < m) & (ks[None, :] < k),
                     other=0.0)
    return values, tl.load(scales + rows * blocks(width) + start // STEP, mask=rows < m, other=1.0)


@triton.jit
def quantize_block(v, q, scales, rows, m, sizes, width, start, BLOCK_M: tl.constexpr,
                   INTERPRETED: tl.constexpr):
    """Rows ``rows`` (those below ``m``) of ``v`` [.., width] quantized at group ``start``
    (``fp8_gemm.quantized``, each row over its first ``sizes`` columns alone) into ``q`` and ``scales``
    (``rows_block``'s layout); a group past a row's size stores zeros and scale 1."""
    values, scale = fp8_gemm.quantized(v, rows, m, sizes[:, None], start, width, BLOCK_M, STEP, INTERPRETED)
    ks = start + tl.arange(0, STEP)
    tl.store(q + rows[:, None] * width + ks[None, :], values,
             mask=(rows[:, None] < m) & (ks[None, :] < width))
    tl.store(scales + rows * blocks(width) + start // STEP, scale, mask=rows < m)


@triton.jit(do_not_specialize=["m", "pairs"])
def _quantize_middles(h, q, scales, m, pairs, inner, shared_inner, width, BLOCK_M: tl.constexpr,
                      INTERPRETED: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    sizes = tl.where(rows < pairs, inner, shared_inner)  # a routed pair's middle, then the shared ones'
    quantize_block(h, q, scales, rows, m, sizes, width, tl.program_id(1) * STEP, BLOCK_M, INTERPRETED)


def quantize_middles(h: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, m: int, pairs: int, inner: int,
                     shared_inner: int) -> None:
    """The middles of ``h``'s first ``m`` rows [.., width] (routed pairs' ``inner`` wide below row
    ``pairs``, then the shared expert's ``shared_inner``) quantized once for every down tile: into
    ``q`` (e4m3, h's shape) and ``scales`` (fp32 [.., blocks(width)]), as a down tile would have
    quantized them."""
    width = h.shape[1]
    _quantize_middles[(triton.cdiv(m, QUANTIZE_ROWS), triton.cdiv(width, STEP.value))](
        h, q, scales, m, pairs, inner, shared_inner, width, BLOCK_M=QUANTIZE_ROWS, INTERPRETED=INTERPRETED,
        **pdl.options(h.device))


@triton.jit
def _gate_up_terms(xq, x_scales, gate, scales, rows, count, cols, size, hidden, stride_n, start,
                   INTERPRETED: tl.constexpr):
    """K block ``start`` of a tile's gate and up terms, x's quantized rows loaded once for both."""
    q, x_scale = rows_block(xq, x_scales, rows, count, hidden, start, hidden)
    ups = size + cols  # the up rows' places among the fused rows: their scale blocks
    at = start // STEP
    gate_scale = tl.load(scales + (cols // STEP) * blocks(hidden) + at, mask=cols < size, other=0.0)
    up_scale = tl.load(scales + (ups // STEP) * blocks(hidden) + at, mask=cols < size, other=0.0)
    gate_term = _term(q, weight_tile(gate, cols, size, hidden, start, stride_n, STEP), x_scale, gate_scale,
                      INTERPRETED)
    up_term = _term(q, weight_tile(gate, ups, 2 * size, hidden, start, stride_n, STEP), x_scale, up_scale,
                    INTERPRETED)
    return gate_term, up_term


@triton.jit
def gate_up_tile(xq, x_scales, gate, scales, stride_n, size, h, q, live, token, count, hidden, width,
                 column_tile, BLOCK_N: tl.constexpr, INTERPRETED: tl.constexpr):
    """``moe_tiles.gate_up_tile`` with FP8 weights: ``gate`` [2 * size, hidden] float8 (gate rows, then
    up rows), ``scales`` its [blocks(2 * size), blocks(hidden)], contiguous; x's rows quantized
    (``fp8_gemm.quantize``: ``xq``, ``x_scales``), ``count`` of them."""
    cols = column_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.where(live, token, count)  # a pair past the tile's end reads no row
    acc_gate, acc_up = _gate_up_terms(xq, x_scales, gate, scales, rows, count, cols, size, hidden, stride_n,
                                      0, INTERPRETED)
    for start in range(STEP, hidden, STEP):
        gate_term, up_term = _gate_up_terms(xq, x_scales, gate, scales, rows, count, cols, size, hidden,
                                            stride_n, start, INTERPRETED)
        acc_gate += gate_term
        acc_up += up_term
    moe_tiles.store_middle(acc_gate, acc_up, h, q, live, cols, size, width)


@triton.jit
def down_weights(w, scales, stride_n, size, hidden, column_tile, start, BLOCK_N: tl.constexpr):
    """K block ``start`` of a down tile's FP8 weights (zeros past inner ``size``) and their scales."""
    cols = column_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    b = weight_tile(w, cols, hidden, size, start, stride_n, STEP)
    scale = tl.load(scales + (cols // STEP) * blocks(size) + start // STEP, mask=cols < hidden, other=0.0)
    return b, scale


@triton.jit
def early(w, scales, stride_n, size, hidden, column_tile, index, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
          FP8: tl.constexpr):
    """K step ``index`` of a down tile's weights and scales, asked for before h is ready (the one launch's
    preload): float in steps of ``BLOCK_K`` (``moe_tiles.down_weights``; its scale a stand-in, never
    read), or FP8 in steps of 128."""
    if FP8:
        return down_weights(w, scales, stride_n, size, hidden, column_tile, index * STEP, BLOCK_N)
    return (moe_tiles.down_weights(w, stride_n, size, hidden, column_tile, index * BLOCK_K, BLOCK_N, BLOCK_K),
            tl.zeros([BLOCK_N], tl.float32))


@triton.jit
def down_step(hq, h_scales, b, scale, q, stop, width, size, start, INTERPRETED: tl.constexpr):
    """K block ``start`` of pairs ``q``'s (those below ``stop``) down term: their middles' block, quantized
    once (``hq``, ``h_scales``: ``quantize_middles``' layout), times the weights ``b`` and their ``scale``."""
    a, h_scale = rows_block(hq, h_scales, q, stop, size, start, width)
    return _term(a, b, h_scale, scale, INTERPRETED)


@triton.jit
def down_tile(hq, h_scales, w, scales, stride_n, size, buf, q, live, stop, weight, dest, hidden, width,
              column_tile, BLOCK_N: tl.constexpr, INTERPRETED: tl.constexpr):
    """``moe_tiles.down_tile`` with FP8 weights: ``w`` [hidden, size] float8, ``scales`` its
    [blocks(hidden), blocks(size)], contiguous; ``stop``: the pair past the tile's last."""
    b, scale = down_weights(w, scales, stride_n, size, hidden, column_tile, 0, BLOCK_N)
    acc = down_step(hq, h_scales, b, scale, q, stop, width, size, 0, INTERPRETED)
    for start in range(STEP, size, STEP):
        b, scale = down_weights(w, scales, stride_n, size, hidden, column_tile, start, BLOCK_N)
        acc += down_step(hq, h_scales, b, scale, q, stop, width, size, start, INTERPRETED)
    moe_tiles.down_store(buf, acc, live, weight, dest, hidden, column_tile, BLOCK_N)


@triton.jit
def down_four(hq, h_scales, b0, s0, b1, s1, b2, s2, b3, s3, q, stop, width, size, INTERPRETED: tl.constexpr):
    """``down_tile``'s sum over an inner size of four K blocks, their weights and scales loaded
    (``down_weights``); the quantized middles stored by another program of the launch, seen after its
    acquire."""
    acc = down_step(hq, h_scales, b0, s0, q, stop, width, size, 0, INTERPRETED)
    acc += down_step(hq, h_scales, b1, s1, q, stop, width, size, STEP, INTERPRETED)
    acc += down_step(hq, h_scales, b2, s2, q, stop, width, size, 2 * STEP, INTERPRETED)
    return acc + down_step(hq, h_scales, b3, s3, q, stop, width, size, 3 * STEP, INTERPRETED)


@triton.jit
def _gate_up_kind(x, xq, x_scales, gate, scales, stride_n, size, h, q, live, token, count, hidden, width,
                  stride_x, column_tile, PRECISION: tl.constexpr, WIDEN: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP8: tl.constexpr):
    """One expert's gate/up tile, float (x) or (``FP8``) FP8 (x's quantized rows)."""
    if FP8:
        gate_up_tile(xq, x_scales, gate, scales, stride_n, size, h, q, live, token, count, hidden, width,
                     column_tile, BLOCK_N, WIDEN)
    else:
        moe_tiles.gate_up_tile(x, gate, stride_n, size, h, q, live, token, hidden, width, stride_x,
                               column_tile, PRECISION, WIDEN, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def gate_up_of(x, xq, x_scales, routed, routed_scales, shared, shared_scales, expert, experts, stride_e,
               stride_n, stride_sn, inner, shared_inner, h, q, live, token, count, hidden, width, stride_x,
               column_tile, PRECISION: tl.constexpr, WIDEN: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP8: tl.constexpr, SHARED_FP8: tl.constexpr):
    """The gate/up tile of ``expert`` (the shared one's id is ``experts``): the routed experts' weights
    ``routed`` float or (``FP8``) FP8 with contiguous ``routed_scales``, the shared expert's likewise
    (``SHARED_FP8``); a float expert's scales are never read. ``count``: x's rows; ``xq``, ``x_scales``:
    them quantized (``fp8_gemm.quantize``), read by FP8 tiles alone."""
    per_expert = blocks(2 * inner) * blocks(hidden)
    if FP8 == SHARED_FP8:  # one kind: the expert's matrix picked by address, as the float tiles always were
        matrix, stride, size = moe_tiles.weight_of(routed, shared, expert, experts, stride_e, stride_n,
                                                   stride_sn, inner, shared_inner)
        scales = routed_scales  # a float expert's: never read
        if FP8:
            scales = scales_of(routed_scales, shared_scales, expert, experts, per_expert)
        _gate_up_kind(x, xq, x_scales, matrix, scales, stride, size, h, q, live, token, count, hidden, width,
                      stride_x, column_tile, PRECISION, WIDEN, BLOCK_M, BLOCK_N, BLOCK_K, FP8)
    elif expert == experts:  # two kinds: a branch each, their pointers of unlike types
        _gate_up_kind(x, xq, x_scales, shared, shared_scales, stride_sn, shared_inner, h, q, live, token,
                      count, hidden, width, stride_x, column_tile, PRECISION, WIDEN, BLOCK_M, BLOCK_N,
                      BLOCK_K, SHARED_FP8)
    else:
        at = expert.to(tl.int64)
        _gate_up_kind(x, xq, x_scales, routed + at * stride_e, routed_scales + at * per_expert, stride_n,
                      inner, h, q, live, token, count, hidden, width, stride_x, column_tile, PRECISION, WIDEN,
                      BLOCK_M, BLOCK_N, BLOCK_K, FP8)


@triton.jit
def _down_kind(h, hq, h_scales, w, scales, stride_n, size, buf, q, live, stop, weight, dest, hidden, width,
               column_tile, PRECISION: tl.constexpr, WIDEN: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, H_CACHE: tl.constexpr, FP8: tl.constexpr):
    """One expert's down tile, float (h) or (``FP8``) FP8 (h's quantized middles)."""
    if FP8:
        down_tile(hq, h_scales, w, scales, stride_n, size, buf, q, live, stop, weight, dest, hidden, width,
                  column_tile, BLOCK_N, WIDEN)
    else:
        moe_tiles.down_tile(h, w, stride_n, size, buf, q, live, weight, dest, hidden, width, column_tile,
                            PRECISION, WIDEN, BLOCK_M, BLOCK_N, BLOCK_K, H_CACHE)


@triton.jit
def down_of(h, hq, h_scales, routed, routed_scales, shared, shared_scales, expert, experts, stride_e,
            stride_n, stride_sn, inner, shared_inner, buf, q, live, stop, weight, dest, hidden, width,
            column_tile, PRECISION: tl.constexpr, WIDEN: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, H_CACHE: tl.constexpr, FP8: tl.constexpr,
            SHARED_FP8: tl.constexpr):
    """The down tile of ``expert`` (``moe_tiles.down_tile``), its weights' kind as ``gate_up_of``'s;
    ``stop``: the pair past the tile's last. ``H_CACHE`` applies to float tiles; an FP8 tile reads the
    middles quantized once (``hq``, ``h_scales``: ``quantize_middles``' layout), after the launch
    boundary or the acquire that shows another program's stores."""
    per_expert = blocks(hidden) * blocks(inner)
    if FP8 == SHARED_FP8:
        matrix, stride, size = moe_tiles.weight_of(routed, shared, expert, experts, stride_e, stride_n,
                                                   stride_sn, inner, shared_inner)
        scales = routed_scales  # a float expert's: never read
        if FP8:
            scales = scales_of(routed_scales, shared_scales, expert, experts, per_expert)
        _down_kind(h, hq, h_scales, matrix, scales, stride, size, buf, q, live, stop, weight, dest, hidden,
                   width, column_tile, PRECISION, WIDEN, BLOCK_M, BLOCK_N, BLOCK_K, H_CACHE, FP8)
    elif expert == experts:
        _down_kind(h, hq, h_scales, shared, shared_scales, stride_sn, shared_inner, buf, q, live, stop,
                   weight, dest, hidden, width, column_tile, PRECISION, WIDEN, BLOCK_M, BLOCK_N, BLOCK_K,
                   H_CACHE, SHARED_FP8)
    else:
        at = expert.to(tl.int64)
        _down_kind(h, hq, h_scales, routed + at * stride_e, routed_scales + at * per_expert, stride_n, inner,
                   buf, q, live, stop, weight, dest, hidden, width, column_tile, PRECISION, WIDEN, BLOCK_M,
                   BLOCK_N, BLOCK_K, H_CACHE, FP8)

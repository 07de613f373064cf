"""A batch-invariant block-wise FP8 product: ``x`` times a Qwen ``-FP8`` weight, row i never
depending on the other rows.

The math is ``tfd.model.fp8``'s (its ``linear`` is the CPU reference). The weight W [out, in] is
float8_e4m3fn ``data`` with float32 ``scale_inv`` [ceil(out/128), ceil(in/128)]. Each row of x is
quantized in 128-wide groups along ``in``: scale = max |x| / 448 (1 where that is 0), q = x / scale
clamped to +-448 and cast to e4m3. Then for each 128-wide K block kb, ascending: the fp32 dot of q_x
and q_w over the block, times (x_scale[r, kb] * w_scale[o // 128, kb]) (the scales multiplied first,
rounded once); the blocks' terms added in order in fp32; the sum cast to x's dtype.

The K step of every tile is 128, the group and the weight's scale block. The rows are quantized first,
once (``quantize``, a launch of its own: each group's max, a correctly rounded division, a clamp, the
cast), and the product reads the e4m3 rows and their scales: a column tile does not quantize its rows
again (at decode a product's 100-200 column tiles each would: 64 padded rows x in divisions a tile,
which outweighed reading the weights). A row's quantization and products never mix rows.

As in ``tfd_kernels.gemm``, K is cut into segments by the weight's shape alone (``gemm_plan.plan``),
each summed from its first block in ascending order; segments are added in order, by the last
program of a tile to arrive (the spread form, few rows: fp32 partials, an arrival counter) or in
registers (the whole form, many rows). Both forms run ``segment_sum``, so they give the same bits,
and which one runs, like the tile, may follow the number of rows. With one segment the sums are
``tfd.model.fp8.linear``'s in order; with several, the segments' association differs from its single
chain (a few fp32 roundings, the same for every batch).

Device notes. Triton's plain fp32 ``/`` may lower to an approximate division on NVIDIA
(``div.full.f32``), so divisions use ``tl.math.div_rn`` (``div.rn.f32``; numpy's division when
interpreted). Kernels launch with ``enable_fp_fusion=False`` so that ``acc + dot * factor`` rounds the
product before the add, as the reference does, rather than fusing an FMA. Every tile has 64 rows a
warp group (the swapped form's, below: 64 columns), so on sm_90 every form multiplies with wgmma fp8
(mma.sync fp8 on smaller tiles was never compared with it), each 128-K block's dot from zero in four
k32 steps.
Triton lets those steps accumulate at the tensor cores' own precision (``max_num_imprecise_acc``), so
on the GPU a block's dot is not fp32's correctly rounded sum, but it is the same for every tile and
row count. The tests compile the kernels for sm_90 and read these instructions in the PTX.

The swapped form (issue 34; ``SWAP_ROWS``, up to 16 rows). At one row the 64-row tile is padding but for a
row, and its x tile (8 KB a stage) doubles a program's shared memory. Up to ``SWAP_ROWS`` rows (at most 16)
``_spread`` runs with ``SWAP``: out^T = W . q^T, the weight tile's 64 columns the dot's M side (a warp
group's wgmma m64), the rows its N side in a block of 16 (``SWAPPED``): 8 KB + 2 KB a stage. Why the
same bits: each element's block dot is the same 128 exact e4m3 products (w[c, k] q[r, k] = q[r, k]
w[c, k]), from zero; its factor the same two scales multiplied first; then the tile is transposed back
to [rows, cols] and the segment sums, the partials summed in segment order, the cast and the conv
epilogue are the unswapped form's own code. Interpreted the dot is exact (the tests show the bits
alike); on sm_90 it is m64n16k32 wgmma with the operands' roles swapped against m64n64k32, and whether
the tensor cores sum a K block's products alike both ways is what the GPU test shows (the H200, forty-first
session: the bits alike, the 9B's FP8 one-stream step 3.83 -> 3.32 ms, the same tokens).

Interpreted (``TRITON_INTERPRET=1``), ``tl.dot`` on fp8 widens to fp16 and is exact, but the
interpreter's fp32 -> e4m3 / bf16 casts round ties up rather than to even and drop the carry into the
exponent (400.0 became 416, 124.0 became 64), so there ``cast`` rounds first (the device's cvt.rn
instructions need no help).
"""

from __future__ import annotations

import attrs
import torch
import triton
import triton.language as tl

from tfd_kernels import conv1d, pdl, runtime
from tfd_kernels.fp8_rows import BLOCK, cast, quantize_tile
from tfd_kernels.gemm import CONV_WIDTH, Conv, conv_after, grouped, summed, weight_tile
from tfd_kernels.gemm_plan import Plan, Tiles, plan
from tfd_kernels.runtime import INTERPRETED

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Tiles: 64 rows a warp group throughout (see the module's device notes); the K step fixed at BLOCK.
# Not swept on a GPU: shapes of gemm_plan's bf16 sweep where they fit that rule.
SPREAD = Tiles(64, 64, BLOCK, 4, 4)  # up to gemm_plan.SPREAD_ROWS rows
# Columns of the few-row tile (an int for tfd bench --variant). 32 halves a program's bytes so that with
# TARGET 128 a [4,096, 4,096] product is 128 programs of one segment, none summing others' partials: a
# program's fixed costs (its pipeline's fill, the last program's sum) weigh against half a bf16 program's
# bytes (H100, each product alone, the launch included: [4,096, 4,096] 13.4 us for a 5.6 us floor, the gate|up
# product at 79%). The segments follow the column tiles, so 32 is other bits. Measured (H100, 9B FP8 one
# stream, fortieth session): 32 with TARGET 128 5.21 ms a step against 4.47; 64 stays.
SPREAD_N = 64
MIDDLE = Tiles(128, 64, BLOCK, 8, 3)  # the spread form's 65 to 128 rows
WHOLE = Tiles(128, 128, BLOCK, 8, 3)  # many rows, one segment or several
# The swapped form (module docstring) runs products of up to SWAP_ROWS rows (at most SWAPPED.block_m; 0: off),
# read at each launch (tfd bench --variant). H200, 9B FP8 one stream: 3.83 ms a step unswapped, 3.32 swapped
SWAP_ROWS = 16
SWAP_STAGES = 6  # its pipeline's stages, 10 KB each; H200, 9B FP8 one stream: 3.32 ms at 4, 3.24 at 6
# its tile: 16 rows (the dot's N side, the least tl.dot takes), 64 columns (its M side: a warp group's); its
# stages SWAP_STAGES (``swapped_tiles``)
SWAPPED = Tiles(16, 64, BLOCK, 4)
# K segments rounded to one program a multiprocessor, not gemm_plan's two: an FP8 weight tile is half a bf16
# one's bytes. The 9B's products alone on an H100 (docs/bench/2026-12-05-fp8-resume/h100/fp8-diag-9b.txt,
# us, 264 -> 132): one row [4096,4096] 10.8 -> 9.6, [4096,12288] 29.7 -> 24.8, [24576,4096] 38.7 -> 39.0,
# [12352,4096] 22.4 -> 22.9; 32 rows 13.3 -> 11.4, 33.5 -> 27.3; a layer's four 5% (one row) and 9% (32)
# faster, and 1,024 rows (the H200's sweep) faster or level
TARGET = 132
QUANTIZE_ROWS = 32  # rows of a ``quantize`` program
GROUP_M = 8  # row blocks of the whole form that share weight tiles through L2 (as gemm's)
COUNTERS = 1 << 16  # output tiles of one spread product at most
# Compile options of every launch: a product rounds before the add that follows it, as the reference's
# does (Triton's default contracts the two into an FMA on the GPU)
OPTIONS = {"enable_fp_fusion": False}


@triton.jit
def quantized(x, rows, m, k, start, stride_xm, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
              EXACT_CAST: tl.constexpr):
    """x's group at ``start`` for ``rows``, quantized: (q e4m3 [BLOCK_M, BLOCK_K], scales fp32
    [BLOCK_M]). Masked elements read 0, which changes no group's max; a masked row has scale 1."""
    ks = start + tl.arange(0, BLOCK_K)
    valid = (rows[:, None] < m) & (ks[None, :] < k)
    a = tl.load(x + rows[:, None] * stride_xm + ks[None, :], mask=valid, other=0.0).to(tl.float32)
    return quantize_tile(a, valid, EXACT_CAST)


@triton.jit
def block_term(x, x_scales, w, w_scales, rows, cols, m, n, k, start, stride_xm, stride_xs, stride_wn,
               stride_sn, stride_sk, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
               SWAP: tl.constexpr = False):
    """The K block at ``start``: its fp32 dot from zero times (x's scale * the weight's scale), x the
    quantized rows (``quantize``'s q and scales); with ``SWAP`` transposed, [cols, rows]: the same dot
    of the same operands, the weight tile its M side (the swapped form, module docstring)."""
    ks = start + tl.arange(0, BLOCK_K)
    q = tl.load(x + rows[:, None] * stride_xm + ks[None, :], mask=(rows[:, None] < m) & (ks[None, :] < k),
                other=0.0)
    x_scale = tl.load(x_scales + rows * stride_xs + start // BLOCK_K, mask=rows < m, other=0.0)
    b = weight_tile(w, cols, n, k, start, stride_wn, BLOCK_K)
    # the weight's scale for each column's 128-row block of out, at this K block
    w_scale = tl.load(w_scales + (cols // BLOCK_K) * stride_sn + (start // BLOCK_K) * stride_sk,
                      mask=cols < n, other=0.0)
    if SWAP:
        term = tl.dot(b, tl.trans(q), out_dtype=tl.float32) * (x_scale[None, :] * w_scale[:, None])
    else:
        term = tl.dot(q, tl.trans(b), out_dtype=tl.float32) * (x_scale[:, None] * w_scale[None, :])
    return term


@triton.jit
def segment_sum(x, x_scales, w, w_scales, rows, cols, m, n, k, start, length, stride_xm, stride_xs, stride_wn,
                stride_sn, stride_sk, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                SWAP: tl.constexpr = False):
    """One segment's fp32 sum of its K blocks start .. start + length (none past k), from its first
    block's term, in ascending order: the reference's chain of additions (``SWAP``: transposed)."""
    total = block_term(x, x_scales, w, w_scales, rows, cols, m, n, k, start, stride_xm, stride_xs, stride_wn,
                       stride_sn, stride_sk, BLOCK_M, BLOCK_K, SWAP)
    for offset in range(BLOCK_K, tl.minimum(length, k - start), BLOCK_K):
        total += block_term(x, x_scales, w, w_scales, rows, cols, m, n, k, start + offset, stride_xm,
                            stride_xs, stride_wn, stride_sn, stride_sk, BLOCK_M, BLOCK_K, SWAP)
    return total


@triton.jit
def _conv_tile(total, tail, rows, cols, m, conv_weight, tails, channels, BLOCK_N: tl.constexpr,
               WIDTH: tl.constexpr, EXACT_CAST: tl.constexpr):
    """A stored tile of the product with the conv applied where its columns are the conv's (whole tiles of
    them): each row its lane's new input, ``tfd_kernels.conv1d.decode``'s bits, the tails moved on. The
    taps are explicit fused multiply-adds on the GPU (this launch does not contract; conv1d's does) and
    plain under the interpreter, as conv1d's are there."""
    if tl.program_id(0) * BLOCK_N < channels:
        live, o0, o1, o2, w0, w1, w2, w_new = conv1d.conv_loads(tail, rows < m, cols, conv_weight, tails,
                                                                channels, WIDTH)
        total = conv1d.conv_apply(total, tail, live, o0, o1, o2, w0, w1, w2, w_new, cols, tails, channels,
                                  WIDTH, not EXACT_CAST)
    return total


# the rows (and a one-column product's partial stride, rows x 1) vary call by call: one variant for all
@triton.jit(do_not_specialize=["m", "stride_ps"])
def _spread(x, x_scales, w, w_scales, partials, out, counters, m, n, k, stride_xm, stride_xs, stride_wn,
            stride_sn, stride_sk, stride_ps, stride_pm, stride_om, k_per_segment, conv_weight, tails, tail_at,
            channels, SEGMENTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_K: tl.constexpr, CONV: tl.constexpr, WIDTH: tl.constexpr, EXACT_CAST: tl.constexpr,
            PDL: tl.constexpr, SWAP: tl.constexpr = False):
    pdl.wait(PDL)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    segment = tl.program_id(2)
    tail = rows  # unread without CONV
    if CONV:  # the lanes' tail offsets, an input no kernel writes, before the product
        tail = tl.load(tail_at + rows, mask=rows < m, other=-1)
    acc = segment_sum(x, x_scales, w, w_scales, rows, cols, m, n, k, segment * k_per_segment, k_per_segment,
                      stride_xm, stride_xs, stride_wn, stride_sn, stride_sk, BLOCK_M, BLOCK_K, SWAP)
    if SWAP:  # [cols, rows] back to [rows, cols]: from here on the unswapped form's code
        acc = tl.trans(acc)
    mask = (rows[:, None] < m) & (cols[None, :] < n)
    dtype = out.dtype.element_ty
    if SEGMENTS == 1:  # nothing to add: the sum goes straight out
        total = cast(acc, dtype, EXACT_CAST)
        if CONV:
            total = _conv_tile(total, tail, rows, cols, m, conv_weight, tails, channels, BLOCK_N, WIDTH,
                               EXACT_CAST)
        tl.store(out + rows[:, None] * stride_om + cols[None, :], total, mask=mask)
    else:
        where = rows[:, None] * stride_pm + cols[None, :]
        tl.store(partials + segment * stride_ps + where, acc, mask=mask)
        tl.debug_barrier()  # every thread's part of the partial is written before it is counted
        tile = counters + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
        if tl.atomic_add(tile, 1, sem="acq_rel", scope="gpu") == SEGMENTS - 1:
            # the tile's last program adds all partials, always in segment order, and rearms its counter
            total = cast(summed(partials, stride_ps, where, mask, SEGMENTS), dtype, EXACT_CAST)
            if CONV:
                total = _conv_tile(total, tail, rows, cols, m, conv_weight, tails, channels, BLOCK_N, WIDTH,
                                   EXACT_CAST)
            tl.store(out + rows[:, None] * stride_om + cols[None, :], total, mask=mask)
            tl.atomic_xchg(tile, 0, sem="relaxed", scope="gpu")


# counts that vary call by call are not specialized on (1, multiples of 16): one variant meets them all
@triton.jit(do_not_specialize=["m", "m_tiles"])
def _whole(x, x_scales, w, w_scales, out, m, n, k, stride_xm, stride_xs, stride_wn, stride_sn, stride_sk,
           stride_om, segments, k_per_segment, n_tiles, m_tiles, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           BLOCK_K: tl.constexpr, ONE_SEGMENT: tl.constexpr, GROUP: tl.constexpr, EXACT_CAST: tl.constexpr,
           PDL: tl.constexpr):
    pdl.wait(PDL)
    tile_m, tile_n = grouped(tl.program_id(0), m_tiles, n_tiles, GROUP)
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    total = segment_sum(x, x_scales, w, w_scales, rows, cols, m, n, k, 0, k_per_segment, stride_xm, stride_xs,
                        stride_wn, stride_sn, stride_sk, BLOCK_M, BLOCK_K)
    if not ONE_SEGMENT:  # one accumulator alone when there is one segment (registers)
        for segment in range(1, segments):  # the same in-order sum as _spread's last program, in registers
            total += segment_sum(x, x_scales, w, w_scales, rows, cols, m, n, k, segment * k_per_segment,
                                 k_per_segment, stride_xm, stride_xs, stride_wn, stride_sn, stride_sk,
                                 BLOCK_M, BLOCK_K)
    tl.store(out + rows[:, None] * stride_om + cols[None, :], cast(total, out.dtype.element_ty, EXACT_CAST),
             mask=(rows[:, None] < m) & (cols[None, :] < n))


@triton.jit(do_not_specialize=["m"])
def _quantize(x, q, scales, m, k, stride_xm, stride_qm, stride_sm, BLOCK_M: tl.constexpr,
              BLOCK_K: tl.constexpr, EXACT_CAST: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    group = tl.program_id(1)
    values, scale = quantized(x, rows, m, k, group * BLOCK_K, stride_xm, BLOCK_M, BLOCK_K, EXACT_CAST)
    ks = group * BLOCK_K + tl.arange(0, BLOCK_K)
    tl.store(q + rows[:, None] * stride_qm + ks[None, :], values,
             mask=(rows[:, None] < m) & (ks[None, :] < k))
    tl.store(scales + rows * stride_sm + group, scale, mask=rows < m)


def default_plan(n: int, k: int) -> Plan:
    """The fixed choice for an FP8 weight [n, k]: ``gemm_plan.plan``'s segments for ``TARGET`` programs
    over this module's tiles (the few-row tile ``SPREAD_N`` columns wide), so the segments follow the
    weight's shape alone and every K step is ``BLOCK``."""
    spread = SPREAD if SPREAD.block_n == SPREAD_N else attrs.evolve(SPREAD, block_n=SPREAD_N)
    return plan(n, k, spread=spread, whole=WHOLE, few=spread, mid=spread, whole_one=WHOLE, middle=MIDDLE,
                narrow=WHOLE, target=TARGET)


def _checked_x(x: torch.Tensor) -> torch.Tensor:
    """``x`` checked as activations [rows, in], contiguous along in (copied if not)."""
    if x.dtype not in DTYPES:
        raise ValueError(f"x must be bfloat16, float16 or float32, not {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [rows, in], not of shape {tuple(x.shape)}")
    return x if x.stride(1) == 1 else x.contiguous()


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [rows, in] (bf16, fp16 or fp32) quantized per row in 128-wide groups by the GEMM's own
    code: (q float8_e4m3fn [rows, in], scales float32 [rows, ceil(in/128)]), the bits of
    ``tfd.model.fp8.quantize_rows``. No scratch. ValueError naming x for a wrong dtype or shape."""
    x = _checked_x(x)
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty(m, triton.cdiv(k, BLOCK), dtype=torch.float32, device=x.device)
    if m and k:
        _quantize[(triton.cdiv(m, QUANTIZE_ROWS), triton.cdiv(k, BLOCK))](
            x, q, scales, m, k, x.stride(0), q.stride(0), scales.stride(0), BLOCK_M=QUANTIZE_ROWS,
            BLOCK_K=BLOCK, EXACT_CAST=INTERPRETED, **OPTIONS, **pdl.options(x.device))
    return q, scales


def _check_weight(x: torch.Tensor, data: torch.Tensor, scale_inv: torch.Tensor) -> None:
    """Raise ValueError naming data or scale_inv unless they make a block-wise FP8 weight for x."""
    if data.dtype != torch.float8_e4m3fn:
        raise ValueError(f"data (weight) must be torch.float8_e4m3fn, not {data.dtype}")
    if data.dim() != 2 or data.shape[1] != x.shape[1] or 0 in data.shape:
        raise ValueError(f"data (weight) must be [out, {x.shape[1]}] (out and in at least 1) for x of shape "
                         f"{tuple(x.shape)}, not of shape {tuple(data.shape)}")
    if data.stride(1) != 1:
        raise ValueError(f"data (weight) must be contiguous along in, its strides are {data.stride()}")
    if scale_inv.dtype != torch.float32:
        raise ValueError(f"scale_inv (weight_scale_inv) must be torch.float32, not {scale_inv.dtype}")
    grid = (triton.cdiv(data.shape[0], BLOCK), triton.cdiv(data.shape[1], BLOCK))
    if tuple(scale_inv.shape) != grid:
        raise ValueError(f"scale_inv (weight_scale_inv) must have shape {grid} for a weight of shape "
                         f"{tuple(data.shape)} in {BLOCK}x{BLOCK} blocks, not {tuple(scale_inv.shape)}")
    if not x.device == data.device == scale_inv.device:
        raise ValueError(f"x, data and scale_inv must share a device: {x.device}, {data.device}, "
                         f"{scale_inv.device}")


def matmul(x: torch.Tensor, data: torch.Tensor, scale_inv: torch.Tensor, spread: bool | None = None,
           choice: Plan | None = None, conv: Conv | None = None) -> torch.Tensor:
    """``x`` [rows, in] (bf16, fp16 or fp32) times the block-wise FP8 weight (``data`` float8_e4m3fn
    [out, in], contiguous along in; ``scale_inv`` float32 [ceil(out/128), ceil(in/128)]), transposed:
    [rows, out] in x's dtype, by ``tfd.model.fp8``'s math, each row's bits the same in any batch:
    ``quantize`` then ``product`` (``conv``: ``product``'s).

    ``spread`` forces a launch form and ``choice`` a plan (tests, benchmarks; every tile's K step must
    be 128); by default the form follows the number of rows and the plan the weight's shape
    (``default_plan``). Scratch: the quantized rows (``rows x in`` bytes) and their scales (fp32, one a
    row and 128-group), fp32 partials of ``segments x rows x out`` when spread over several segments,
    freed on return; the device's arrival counters (kept). ValueError naming the
    argument at fault: x's dtype or rank, data's dtype, shape or strides, scale_inv's dtype or grid
    shape, unlike devices, a choice whose K step is not 128, a spread product of too many tiles.
    """
    x = _checked_x(x)
    _check_weight(x, data, scale_inv)
    q, q_scales = quantize(x)  # once a row and group, not again in every column tile that reads them
    return product(q, q_scales, data, scale_inv, x.dtype, spread, choice, conv)


def product(q: torch.Tensor, q_scales: torch.Tensor, data: torch.Tensor, scale_inv: torch.Tensor,
            dtype: torch.dtype, spread: bool | None = None, choice: Plan | None = None,
            conv: Conv | None = None) -> torch.Tensor:
    """``matmul``'s product from rows quantized already (``quantize``'s q and scales, or a kernel's that
    quantized the rows it made, ``tfd_kernels.fp8_rows``): [rows, out] in ``dtype``. With ``conv``
    (``tfd_kernels.gemm.Conv``: the GDN projection's), the result's first ``conv.weight.shape[0]``
    columns are that conv's output instead, ``tfd_kernels.conv1d.decode``'s bits with its tails moved
    on: the spread form (swapped too) applies it as it stores where those columns are whole tiles
    (``takes_conv``), else it runs after the product. ValueError as ``matmul``'s, naming q or q_scales
    where they are not quantized rows, and conv's parts as ``conv1d.decode`` names them."""
    if q.dtype != torch.float8_e4m3fn or q.dim() != 2 or q.stride(1) != 1:
        raise ValueError(f"q must be float8_e4m3fn [rows, in] with unit column stride, not {q.dtype} "
                         f"{tuple(q.shape)}")
    groups = triton.cdiv(q.shape[1], BLOCK)
    if q_scales.dtype != torch.float32 or tuple(q_scales.shape) != (q.shape[0], groups) \
            or q_scales.stride(1) != 1:
        raise ValueError(f"q_scales must be float32 [{q.shape[0]}, {groups}] with unit column stride, not "
                         f"{q_scales.dtype} {tuple(q_scales.shape)}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be bfloat16, float16 or float32, not {dtype}")
    _check_weight(q, data, scale_inv)
    m, k = q.shape
    n = data.shape[0]
    choice = choice or default_plan(n, k)
    if choice.k_per_segment % BLOCK or any(t.block_k != BLOCK for t in attrs.astuple(choice, recurse=False)
                                           if isinstance(t, Tiles)):
        raise ValueError(f"choice must take K steps and segments of whole {BLOCK}-wide blocks: {choice}")
    out = torch.empty(m, n, dtype=dtype, device=q.device)
    if m == 0:
        return out
    if spread is None:
        spread = choice.spreads(m, n, 1)  # the K step never shrinks here: the fp8 operands' size
    swap = spread and m <= min(SWAP_ROWS, SWAPPED.block_m)  # the few-row form swapped, where switched on
    t = swapped_tiles() if swap else choice.spread_tiles(m)
    if conv is not None and not (spread and takes_conv(conv, n, t)):
        return conv_after(product(q, q_scales, data, scale_inv, dtype, spread, choice), conv)
    common = (m, n, k, q.stride(0), q_scales.stride(0), data.stride(0), scale_inv.stride(0),
              scale_inv.stride(1))
    options = {"EXACT_CAST": INTERPRETED, **OPTIONS, **pdl.options(q.device)}
    if not spread:
        t = choice.whole_tiles(1)
        n_tiles, m_tiles = triton.cdiv(n, t.block_n), triton.cdiv(m, t.block_m)
        _whole[(n_tiles * m_tiles,)](q, q_scales, data, scale_inv, out, *common, out.stride(0),
                                     choice.segments, choice.k_per_segment, n_tiles, m_tiles,
                                     BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=BLOCK,
                                     ONE_SEGMENT=choice.segments == 1, GROUP=GROUP_M, num_warps=t.warps,
                                     num_stages=t.stages, **options)
        return out
    grid = (triton.cdiv(n, t.block_n), triton.cdiv(m, t.block_m))
    if grid[0] * grid[1] > COUNTERS:
        raise ValueError(f"x and data make a spread product of {grid[0] * grid[1]} output tiles, more than "
                         f"the {COUNTERS} counted")
    one = choice.segments == 1
    partials = out if one else torch.empty(choice.segments, m, n, dtype=torch.float32, device=q.device)
    counters = runtime.counters("fp8_gemm.spread", COUNTERS, q.device)
    width, convolved = 2, (data, out, out, 0)  # stand-ins without a conv, never read
    if conv is not None:
        width = conv1d.checked_width(conv.weight.shape[0], dtype, conv.weight, conv.tails, conv.tail_at, m)
        convolved = (conv.weight.contiguous(), conv.tails, conv.tail_at, conv.weight.shape[0])
    _spread[(*grid, choice.segments)](q, q_scales, data, scale_inv, partials, out, counters, *common,
                                      0 if one else partials.stride(0), 0 if one else partials.stride(1),
                                      out.stride(0), choice.k_per_segment, *convolved,
                                      SEGMENTS=choice.segments, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
                                      BLOCK_K=BLOCK, CONV=conv is not None, WIDTH=width, SWAP=swap,
                                      num_warps=t.warps, num_stages=t.stages, **options)
    return out


def swapped_tiles() -> Tiles:
    """The swapped form's tile as it launches now: ``SWAPPED`` in ``SWAP_STAGES`` stages."""
    return attrs.evolve(SWAPPED, stages=SWAP_STAGES)


def takes_conv(conv: Conv, n: int, tiles: Tiles) -> bool:
    """Whether the spread form applies ``conv`` as it stores: its columns whole ``tiles``' column tiles
    of the ``n`` columns, a width the epilogue reads at once (``gemm.CONV_WIDTH``)."""
    channels = conv.weight.shape[0]
    return channels <= n and channels % tiles.block_n == 0 and conv.weight.shape[-1] <= CONV_WIDTH

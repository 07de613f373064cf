"""A batch-invariant matrix product: ``x @ w.T`` whose row i never depends on the other rows.

Library GEMMs choose tiles and split-K by the number of rows, so a row's bits change with the
batch (reference/gpu-facts.md measured one such shape on the H200). Here the tiles, the split of K
into segments and the order in which segment sums are added are fixed by the weight's shape alone:
each segment is accumulated from zero in fp32 over the same K tiles, and the segments are added in
order. Two launch forms give the same bits: few rows spread the segments over programs (fp32
partials in memory; the last program of an output tile to finish, found by an arrival counter,
adds them in order), enough to keep every multiprocessor reading weights;
many rows keep a tile's segments in one program and add them in registers. Both run the same
``segment_sum`` code, so the form may follow the number of rows.

The tile shape may follow the number of rows too: on the H200 (Triton 3.6) a product's bits were
the same for every tile tried, 16 to 128 rows (mma and wgmma), 32 to 256 columns, 64 or 128 K per
step, 4 or 8 warps, as long as the K segments were the same (tfd bench --gemm and the GPU tests
check this property). Tiles below come from that sweep.

Many rows take the whole form through tensor descriptors (TMA) where the GPU and the operands allow,
its programs ordered so that groups of row blocks share weight tiles in L2: the same sums, the same
bits as the pointer loads (H200 probe).

``matmul`` is the launcher, ``reference`` the torch reference; the shape's fixed choice of segments
and tiles is ``tfd_kernels.gemm_plan``'s.
"""

from __future__ import annotations

import attrs
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from tfd_kernels import conv1d, pdl, runtime
from tfd_kernels.gemm_plan import Plan, Tiles, plan
from tfd_kernels.runtime import INTERPRETED
from tfd_kernels.swiglu import PAIR, silu_mul
from tfd_kernels.swiglu import swiglu as swiglu_rows

GROUP_M = 8  # row blocks of the whole form that share weight tiles through L2 (probe: 8 beat 16)
# Rows up to which the spread form applies a conv as it stores: its epilogue takes 114 registers a thread
# at 16-row tiles (64 without), 172 at 32 (80 without: a third fewer programs resident), sm_90 ptxas.
CONV_ROWS = 16
# K steps of weights a spread program of a product called ``early`` asks for before it waits for the kernel
# before: the products after the MoE block at decode (GDN's projection, attention's qkv). H200, one stream,
# tfd bench --variant (best of three): 35B-A3B GDN projection 1 step 2.4554 ms, 2 steps 2.4651, none 2.4688
# (9B: 4.5097 against 4.5156); qkv too 2.4434 against 2.4475. At the other products 1 step lost (out
# projections 2.4662, the head 2.4493), as every product at once had (fifth session).
EARLY_STEPS = 1
MOST_EARLY = 4  # the spread program's tiles held for it (b0 .. b3)
# The conv's reads (its tail rows and weights) asked for by a tile's last program with the partials', where
# each tap's read had waited for the one before; widths up to CONV_WIDTH (a wider conv runs after the
# product, tfd_kernels.conv1d.decode: the same bits). H200, 35B-A3B one stream, tfd bench --variant, best of
# three (2026-12-02): 2.4274 ms against 2.4381 with the taps read in turn (9B 4.4862 against 4.4987).
CONV_WIDTH = 4


@attrs.frozen
class Conv:
    """The depthwise causal conv of ``tfd_kernels.conv1d.decode`` over a product's first
    ``weight.shape[0]`` columns, each row a lane's new input: the GDN projection's conv columns."""

    weight: torch.Tensor  # [channels, width]
    tails: torch.Tensor  # the pool's view in the model dtype
    tail_at: torch.Tensor  # [rows] int64 element offsets, -1 for padding


@triton.jit
def weight_tile(w, cols, n, k, start, stride_wn, BLOCK_K: tl.constexpr):
    """The weight's K tile at ``start`` for columns ``cols`` (zeros past n and k)."""
    ks = start + tl.arange(0, BLOCK_K)
    return tl.load(w + cols[:, None] * stride_wn + ks[None, :], mask=(cols[:, None] < n) & (ks[None, :] < k),
                   other=0.0)


@triton.jit
def tile_dot(x, b, acc, rows, m, k, start, stride_xm, BLOCK_K: tl.constexpr, WIDEN: tl.constexpr):
    """``acc`` plus x's K tile at ``start`` times the weight tile ``b``: one step of a segment."""
    ks = start + tl.arange(0, BLOCK_K)
    a = tl.load(x + rows[:, None] * stride_xm + ks[None, :], mask=(rows[:, None] < m) & (ks[None, :] < k),
                other=0.0)
    if WIDEN:
        a, b = a.to(tl.float32), b.to(tl.float32)
    return tl.dot(a, tl.trans(b), acc, input_precision="ieee")  # fp32 stays fp32, never tf32


@triton.jit
def segment_from(acc, x, w, rows, cols, m, n, k, start, length, stride_xm, stride_wn, BLOCK_K: tl.constexpr,
                 WIDEN: tl.constexpr):
    """``acc`` plus a segment's K tiles start .. start + length, in order."""
    for offset in range(0, length, BLOCK_K):
        b = weight_tile(w, cols, n, k, start + offset, stride_wn, BLOCK_K)
        acc = tile_dot(x, b, acc, rows, m, k, start + offset, stride_xm, BLOCK_K, WIDEN)
    return acc


@triton.jit
def segment_sum(x, w, rows, cols, m, n, k, start, length, stride_xm, stride_wn,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WIDEN: tl.constexpr):
    """One segment's fp32 sum over K tiles start .. start + length, from zero."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    return segment_from(acc, x, w, rows, cols, m, n, k, start, length, stride_xm, stride_wn, BLOCK_K, WIDEN)


@triton.jit
def segment_sum_early(x, w, b0, b1, b2, b3, rows, cols, m, n, k, start, length, stride_xm, stride_wn,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      WIDEN: tl.constexpr, EARLY: tl.constexpr):
    """``segment_sum``, its first ``EARLY`` (0 to 4, at most the segment's steps) K steps' weight
    tiles ``b0`` .. ``b3`` loaded already (``weight_tile``): the same steps in the same order, so
    the same bits."""
    if EARLY:
        acc = tile_dot(x, b0, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), rows, m, k, start, stride_xm,
                       BLOCK_K, WIDEN)
        if EARLY > 1:
            acc = tile_dot(x, b1, acc, rows, m, k, start + BLOCK_K, stride_xm, BLOCK_K, WIDEN)
        if EARLY > 2:
            acc = tile_dot(x, b2, acc, rows, m, k, start + 2 * BLOCK_K, stride_xm, BLOCK_K, WIDEN)
        if EARLY > 3:
            acc = tile_dot(x, b3, acc, rows, m, k, start + 3 * BLOCK_K, stride_xm, BLOCK_K, WIDEN)
        rest = EARLY * BLOCK_K
        acc = segment_from(acc, x, w, rows, cols, m, n, k, start + rest, length - rest, stride_xm, stride_wn,
                           BLOCK_K, WIDEN)
    else:
        acc = segment_sum(x, w, rows, cols, m, n, k, start, length, stride_xm, stride_wn, BLOCK_M, BLOCK_N,
                          BLOCK_K, WIDEN)
    return acc


@triton.jit
def summed(partials, stride_ps, where, mask, SEGMENTS: tl.constexpr):
    """A tile's fp32 partials added in segment order. Unrolled, so every segment's load is in flight
    at once: a loop waited out one L2 round trip a segment (8 segments of a 2048x4096 product)."""
    total = tl.load(partials + where, mask=mask, other=0.0, cache_modifier=".cg")
    for other in tl.static_range(1, SEGMENTS):
        total += tl.load(partials + other * stride_ps + where, mask=mask, other=0.0, cache_modifier=".cg")
    return total


# the rows (and a one-column product's partial stride, rows x 1) vary call by call: one variant meets them
# all (the Flash Next demo compiled three while serving, at row counts its warm-up's prompts had not met)
@triton.jit(do_not_specialize=["m", "stride_ps"])
def _spread(x, w, partials, out, counters, m, n, k, stride_xm, stride_wn, stride_ps, stride_pm, stride_om,
            k_per_segment, conv_weight, tails, tail_at, channels, SEGMENTS: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WIDEN: tl.constexpr,
            SWIGLU: tl.constexpr, PAIR: tl.constexpr, CONV: tl.constexpr, WIDTH: tl.constexpr,
            EARLY: tl.constexpr, PDL: tl.constexpr):
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    segment = tl.program_id(2)
    start = segment * k_per_segment
    b0, b1, b2, b3 = w, w, w, w  # unread unless asked for below
    if EARLY:  # the first K steps' weights asked for before the wait: they come while the kernel before ends
        b0 = weight_tile(w, cols, n, k, start, stride_wn, BLOCK_K)
        if EARLY > 1:
            b1 = weight_tile(w, cols, n, k, start + BLOCK_K, stride_wn, BLOCK_K)
        if EARLY > 2:
            b2 = weight_tile(w, cols, n, k, start + 2 * BLOCK_K, stride_wn, BLOCK_K)
        if EARLY > 3:
            b3 = weight_tile(w, cols, n, k, start + 3 * BLOCK_K, stride_wn, BLOCK_K)
    pdl.wait(PDL)
    if CONV:  # the lanes' tail offsets, an input no kernel writes, before the product
        tail = tl.load(tail_at + rows, mask=rows < m, other=-1)
    acc = segment_sum_early(x, w, b0, b1, b2, b3, rows, cols, m, n, k, start, k_per_segment, stride_xm,
                            stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, WIDEN, EARLY)
    mask = (rows[:, None] < m) & (cols[None, :] < n)
    where = rows[:, None] * stride_pm + cols[None, :]
    tl.store(partials + segment * stride_ps + where, acc, mask=mask)
    tl.debug_barrier()  # every thread's part of the partial is written before it is counted
    tile = counters + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    if tl.atomic_add(tile, 1, sem="acq_rel", scope="gpu") == SEGMENTS - 1:
        # the tile's last program adds all partials, always in segment order, and rearms its counter
        dtype = out.dtype.element_ty
        if SWIGLU:  # the tile holds whole gate|up pairs: each pair's middle, rounded as tfd_kernels.swiglu
            half = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
            gate_at = rows[:, None] * stride_pm + ((half // PAIR) * (2 * PAIR) + half % PAIR)[None, :]
            live = (rows[:, None] < m) & (half[None, :] < n // 2)
            gate = summed(partials, stride_ps, gate_at, live, SEGMENTS).to(dtype)
            up = summed(partials, stride_ps, gate_at + PAIR, live, SEGMENTS).to(dtype)
            tl.store(out + rows[:, None] * stride_om + half[None, :], silu_mul(gate, up, dtype), mask=live)
        elif CONV:  # the conv's reads asked for with the partials'
            # nothing read past the conv's columns (whole tiles of them: a tile has all or none)
            live, o0, o1, o2, w0, w1, w2, w_new = conv1d.conv_loads(tail, rows < m, cols, conv_weight, tails,
                                                                    channels, WIDTH)
            total = summed(partials, stride_ps, where, mask, SEGMENTS).to(dtype)
            if tl.program_id(0) * BLOCK_N < channels:  # the conv's columns: a row is its lane's new input
                total = conv1d.conv_apply(total, tail, live, o0, o1, o2, w0, w1, w2, w_new, cols, tails,
                                          channels, WIDTH)
            tl.store(out + rows[:, None] * stride_om + cols[None, :], total, mask=mask)
        else:
            total = summed(partials, stride_ps, where, mask, SEGMENTS).to(dtype)
            tl.store(out + rows[:, None] * stride_om + cols[None, :], total, mask=mask)
        tl.atomic_xchg(tile, 0, sem="relaxed", scope="gpu")


@triton.jit
def _segment_tma(x, w, first_row, first_col, start, length, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """``segment_sum`` through tensor descriptors: the same sum (K past the end reads as zero)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for offset in range(0, length, BLOCK_K):
        acc = tl.dot(x.load([first_row, start + offset]), w.load([first_col, start + offset]).T, acc,
                     input_precision="ieee")
    return acc


@triton.jit
def grouped(program, m_tiles, n_tiles, GROUP: tl.constexpr):
    """Program ``program``'s (row block, column tile) of ``m_tiles`` by ``n_tiles`` on one grid axis:
    GROUP row blocks walk the columns together, so each weight tile they share is read from L2."""
    per_group = GROUP * n_tiles
    first_m = (program // per_group) * GROUP
    size = tl.minimum(m_tiles - first_m, GROUP)
    return first_m + (program % per_group) % size, (program % per_group) // size


# counts that vary call by call are not specialized on (1, multiples of 16): one variant meets them all
@triton.jit(do_not_specialize=["m", "m_tiles"])
def _whole(x, w, out, m, n, k, stride_xm, stride_wn, stride_om, segments, k_per_segment, n_tiles, m_tiles,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WIDEN: tl.constexpr,
           ONE_SEGMENT: tl.constexpr, TMA: tl.constexpr, GROUP: tl.constexpr, SWIGLU: tl.constexpr,
           PAIR: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    tile_m, tile_n = grouped(tl.program_id(0), m_tiles, n_tiles, GROUP)
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if TMA:
        total = _segment_tma(x, w, tile_m * BLOCK_M, tile_n * BLOCK_N, 0, k_per_segment, BLOCK_M, BLOCK_N,
                             BLOCK_K)
    else:
        total = segment_sum(x, w, rows, cols, m, n, k, 0, k_per_segment, stride_xm, stride_wn,
                            BLOCK_M, BLOCK_N, BLOCK_K, WIDEN)
    if not ONE_SEGMENT:  # one accumulator alone when there is one segment: half the registers (sm_90)
        for segment in range(1, segments):  # the same in-order sum as _spread's last program, in registers
            if TMA:
                total += _segment_tma(x, w, tile_m * BLOCK_M, tile_n * BLOCK_N, segment * k_per_segment,
                                      k_per_segment, BLOCK_M, BLOCK_N, BLOCK_K)
            else:
                total += segment_sum(x, w, rows, cols, m, n, k, segment * k_per_segment, k_per_segment,
                                     stride_xm, stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, WIDEN)
    dtype = out.dtype.element_ty
    if SWIGLU:  # the tile holds whole gate|up pairs: split each block of pairs as _spread's last program does
        pairs = tl.permute(tl.reshape(total, (BLOCK_M, BLOCK_N // (2 * PAIR), 2, PAIR)), (0, 1, 3, 2))
        gate, up = tl.split(pairs)
        gate = tl.reshape(gate, (BLOCK_M, BLOCK_N // 2)).to(dtype)
        up = tl.reshape(up, (BLOCK_M, BLOCK_N // 2)).to(dtype)
        half = tile_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(out + rows[:, None] * stride_om + half[None, :], silu_mul(gate, up, dtype),
                 mask=(rows[:, None] < m) & (half[None, :] < n // 2))
    else:
        tl.store(out + rows[:, None] * stride_om + cols[None, :], total.to(dtype),
                 mask=(rows[:, None] < m) & (cols[None, :] < n))


def described(t: torch.Tensor, block: list[int]) -> TensorDescriptor | None:
    """A tensor descriptor of ``t``'s ``block`` tiles where TMA can read it: a GPU of compute capability
    9 or above, 16-bit elements, a 16-byte aligned base and row stride; else None."""
    if INTERPRETED or t.device.type != "cuda" or t.element_size() != 2 or \
            torch.cuda.get_device_capability(t.device)[0] < 9:
        return None
    if t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16:
        return None
    return TensorDescriptor.from_tensor(t, block)


def _described(x: torch.Tensor, w: torch.Tensor, t: Tiles) -> tuple[object, object] | None:
    """Tensor descriptors of x and w for the whole form's tile where TMA can read both, else None."""
    xs, ws = described(x, [t.block_m, t.block_k]), described(w, [t.block_n, t.block_k])
    return None if xs is None or ws is None else (xs, ws)


def matmul(x: torch.Tensor, w: torch.Tensor, spread: bool | None = None, choice: Plan | None = None,
           swiglu: bool = False, conv: Conv | None = None, early: bool = False) -> torch.Tensor:
    """``x @ w.T`` for ``x`` [m, k] and ``w`` [n, k], both contiguous in k; the result in x's dtype.
    With ``swiglu``, w is a gate|up weight laid out by ``tfd_kernels.swiglu.pair_rows`` and the result
    is SwiGLU's middle [m, n / 2]: each form forms it from the summed tile before it stores (the
    whole form only when its tile holds whole pairs; else it writes the product and
    ``tfd_kernels.swiglu`` reads it), the same bits as the plain product, then ``swiglu`` on the
    unpaired columns.

    With ``conv``, the result's first ``conv.weight.shape[0]`` columns are that conv's output instead
    (``tfd_kernels.conv1d.decode``'s bits, its tails moved forward): the spread form applies it as it
    stores, up to ``CONV_ROWS`` rows and when those columns are whole tiles; else the conv runs
    after the product.

    With ``early``, each spread program asks for its first ``EARLY_STEPS`` K steps of weights before
    it waits for the kernel before it (dependent launch), so they come while that kernel ends: for a
    product after a kernel whose end reads little memory. The same bits.

    ``spread`` forces a launch form and ``choice`` a plan (tests, benchmarks); by default the form
    follows the number of rows and the plan the weight's shape. Scratch: fp32 partials of
    ``segments x m x n`` when spread, freed on return, and the device's arrival counters (kept).
    """
    if x.dim() != 2 or w.dim() != 2 or w.shape[1] != x.shape[1]:
        raise ValueError(f"x is {list(x.shape)} but w is {list(w.shape)}: want [m, k] and [n, k]")
    m, k = x.shape
    n = w.shape[0]
    if swiglu and n % (2 * PAIR):
        raise ValueError(f"w has {n} rows; a paired gate|up weight has a multiple of {2 * PAIR}")
    if x.stride(1) != 1:
        x = x.contiguous()
    if w.stride(1) != 1:
        raise ValueError(f"w must be contiguous along k, its strides are {w.stride()}")
    choice = choice or plan(n, k)
    if spread is None:
        spread = choice.spreads(m, n, x.element_size())
    whole = choice.whole_tiles(x.element_size(), m, n)
    forms_middle = swiglu and (spread or whole.block_n % (2 * PAIR) == 0)  # the tile holds whole pairs
    out = torch.empty(m, n // 2 if forms_middle else n, dtype=x.dtype, device=x.device)
    if not spread:
        n_tiles, m_tiles = triton.cdiv(n, whole.block_n), triton.cdiv(m, whole.block_m)
        if m:
            described = _described(x, w, whole)
            xs, ws = described if described is not None else (x, w)
            _whole[(n_tiles * m_tiles,)](
                xs, ws, out, m, n, k, x.stride(0), w.stride(0), out.stride(0), choice.segments,
                choice.k_per_segment, n_tiles, m_tiles, BLOCK_M=whole.block_m, BLOCK_N=whole.block_n,
                BLOCK_K=whole.block_k, WIDEN=INTERPRETED, ONE_SEGMENT=choice.segments == 1,
                TMA=described is not None, GROUP=GROUP_M, SWIGLU=forms_middle, PAIR=PAIR,
                num_warps=whole.warps, num_stages=whole.stages, **pdl.options(x.device))
        out = swiglu_rows(out, paired=True) if swiglu and not forms_middle else out
        return out if conv is None else conv_after(out, conv)
    if m == 0:
        return out if conv is None else conv_after(out, conv)
    t = choice.spread_tiles(m)
    if swiglu and t.block_n % (2 * PAIR):
        raise ValueError(f"a {t.block_n}-column tile holds no whole gate|up pairs of {PAIR}")
    channels = 0 if conv is None else conv.weight.shape[0]
    if conv is not None and (swiglu or channels > n or channels % t.block_n or t.block_m > CONV_ROWS
                             or conv.weight.shape[-1] > CONV_WIDTH):
        return conv_after(_spread_product(x, w, out, choice, t, swiglu, None, early), conv)
    return _spread_product(x, w, out, choice, t, swiglu, conv, early)


def _spread_product(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, choice: Plan, t: Tiles, swiglu: bool,
                    conv: Conv | None, early: bool) -> torch.Tensor:
    """The spread form's launch into ``out``, with ``conv`` applied as each tile stores, ``early`` as
    ``matmul``'s."""
    m, k = x.shape
    n = w.shape[0]
    width = 2
    if conv is not None:
        width = conv1d.checked_width(conv.weight.shape[0], x.dtype, conv.weight, conv.tails, conv.tail_at, m)
    grid = (triton.cdiv(n, t.block_n), triton.cdiv(m, t.block_m))
    # K steps asked for before the wait: each segment holds at least that many (plan's whole steps)
    steps = min(EARLY_STEPS if early else 0, choice.k_per_segment // t.block_k, MOST_EARLY)
    partials = torch.empty(choice.segments, m, n, dtype=torch.float32, device=x.device)
    _spread[(*grid, choice.segments)](x, w, partials, out, _counters(x.device, grid[0] * grid[1]), m, n, k,
                                      x.stride(0), w.stride(0), partials.stride(0), partials.stride(1),
                                      out.stride(0), choice.k_per_segment,
                                      *((conv.weight.contiguous(), conv.tails, conv.tail_at,
                                         conv.weight.shape[0]) if conv is not None else (w, out, out, 0)),
                                      SEGMENTS=choice.segments, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
                                      BLOCK_K=t.block_k, WIDEN=INTERPRETED, SWIGLU=swiglu, PAIR=PAIR,
                                      CONV=conv is not None, WIDTH=width, EARLY=steps,
                                      num_warps=t.warps, num_stages=t.stages, **pdl.options(x.device))
    return out


def conv_after(out: torch.Tensor, conv: Conv) -> torch.Tensor:
    """``out`` with ``conv`` run over its first columns by ``tfd_kernels.conv1d.decode`` (same bits)."""
    channels = conv.weight.shape[0]
    out[:, :channels] = conv1d.decode(out[:, :channels], conv.weight, conv.tails, conv.tail_at)
    return out


COUNTERS = 1 << 16  # output tiles of one spread product at most: 4 x 16-row tiles of a 248,320-wide head


def _counters(device: torch.device, tiles: int) -> torch.Tensor:
    """The device's arrival counters of spread products (each tile's last program rearms its own),
    shared by every product on the device, which run one at a time on one stream."""
    if tiles > COUNTERS:
        raise ValueError(f"a spread product of {tiles} output tiles, more than the {COUNTERS} counted")
    return runtime.counters("gemm.spread", COUNTERS, device)


def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The same product by torch, in fp32, cast to x's dtype."""
    return (x.float() @ w.float().T).to(x.dtype)

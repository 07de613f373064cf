"""Row norms, one program per row so a row's bits never depend on how many rows share the launch.

``zrms`` is the zero-centred RMSNorm of the residual (scale ``1 + weight``); ``gated_rms`` the GDN
output norm (plain RMSNorm with ``weight``, times the activated gate), per value head. Both read
their inputs once and write one output; the arithmetic and its cast points follow
``tfd.model.ops`` (fp32 statistics; the gated form rounds the normalised value to the model dtype
before the weight, as the reference does). torch's own reductions choose their split by the
number of rows, which is why these exist.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import fp8_rows, pdl
from tfd_kernels.runtime import INTERPRETED

ACTIVATIONS = {"silu": 0, "sigmoid": 1}
GATED_HEADS = 4  # heads a gated-norm program takes: one head of 128 was one value a thread (262k programs)
# The norms ask for their weight, which no kernel writes, before they wait for the kernel before (dependent
# launch), so it comes from memory while that kernel ends; the same bits either way.
# H200, 35B-A3B one stream, tfd bench --variant, best of three (2026-12-02):
# 2.4298 ms against 2.4381 without; with the three other load orders of that call, 2.4123.
WEIGHTS_EARLY = True


def warps(block: int) -> int:
    """Warps of a norm over ``block`` columns: the same for ``zrms`` and ``add_zrms``, so the two
    sum a row's squares in one order (the prompt path normalises with one, decode with the other).
    8 from 4096 up: 1.48 us a 4096-wide row on the H200, against 2.07 with Triton's default 4."""
    return 8 if block >= 4096 else 4


@triton.jit
def _zrms(x, weight, out, q, scales, width, stride_x, stride_o, stride_wg, stride_q, stride_s, eps,
          BLOCK: tl.constexpr, EARLY: tl.constexpr, QUANTIZE: tl.constexpr, EXACT_CAST: tl.constexpr,
          PDL: tl.constexpr):
    row, part = tl.program_id(0), tl.program_id(1)  # a program a group: its columns normalised on their own
    cols = tl.arange(0, BLOCK)
    mask = cols < width
    if EARLY:  # the weight, which no kernel writes, asked for before the wait
        w = tl.load(weight + part * stride_wg + cols, mask=mask, other=0.0).to(tl.float32)
    pdl.wait(PDL)
    if not EARLY:
        w = tl.load(weight + part * stride_wg + cols, mask=mask, other=0.0).to(tl.float32)
    at = part * width + cols  # groups lie ``width`` apart; BLOCK only pads one to a power of two
    values = tl.load(x + row * stride_x + at, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(values * values, axis=0) / width
    scaled = values * tl.rsqrt(mean + eps)
    result = (scaled * (1.0 + w)).to(out.dtype.element_ty)
    tl.store(out + row * stride_o + at, result, mask=mask)
    if QUANTIZE:  # one group of the row a program (quantize() refuses groups): the row whole
        fp8_rows.store_groups(result.to(tl.float32), mask, q, scales, row * stride_q + cols, row * stride_s,
                              BLOCK // 128, EXACT_CAST)


def zrms(x: torch.Tensor, weight: torch.Tensor, eps: float, group: int | None = None,
         rows: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Zero-centred RMSNorm of each row of ``x`` [rows, width], or of each ``group`` columns of
    it; ``weight`` is one group's (shared by the groups) or the whole row's. A program a row and
    group: one program walking a hyper-connection stack's four groups in turn took 5.7 us a row on
    the H200, each group waiting out the one before. ``rows`` (``fp8_rows.empty_rows``): the result
    quantized there too, as ``fp8_gemm.quantize`` would (``quantizes``: whole rows only)."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [rows, width] with unit column stride, got {list(x.shape)}")
    width = group or x.shape[1]
    if x.shape[1] % width or weight.shape not in ((width,), (x.shape[1],)):
        raise ValueError(f"weight is {list(weight.shape)} for rows of {x.shape[1]} in groups of {width}")
    if rows is not None and (group is not None or not quantizes(x.shape[1])):
        raise ValueError(f"rows: a norm quantizes whole rows of a multiple of 128 columns, not {x.shape[1]}"
                         + (f" in groups of {group}" if group is not None else ""))
    out = torch.empty_like(x)
    block = triton.next_power_of_2(width)
    stride_wg = width if weight.shape[0] == x.shape[1] and group else 0
    q, scales = fp8_rows.targets(rows, x.shape[0], x.shape[1], out)
    if x.shape[0]:
        _zrms[(x.shape[0], x.shape[1] // width)](
            x, weight, out, q, scales, width, x.stride(0), out.stride(0), stride_wg, q.stride(0),
            scales.stride(0), eps, BLOCK=block, EARLY=WEIGHTS_EARLY, QUANTIZE=rows is not None,
            EXACT_CAST=INTERPRETED, num_warps=warps(block), **pdl.options(x.device))
    return out


def quantizes(width: int) -> bool:
    """Whether the norms can write rows of ``width`` quantized as well: whole 128-wide groups."""
    return width % 128 == 0


@triton.jit
def added(x, delta, at, mask, dtype: tl.constexpr):
    """x at ``at`` + ``delta`` in fp32, rounded to ``dtype`` as the model's x + delta would be: the
    residual sum, before it is normalised (``add_zrms_row``, and a block of columns of it in
    tfd_kernels.moe_sum.finish_spread)."""
    return (tl.load(x + at, mask=mask, other=0.0).to(tl.float32) + delta.to(tl.float32)).to(dtype)


@triton.jit
def row_weight(weight, cols, mask):
    """A norm's weight at ``cols`` in fp32, as ``zrms_row`` takes it."""
    return tl.load(weight + cols, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def zrms_row(values, out, w, at, mask, width, eps):
    """The zero-centred norm of one row's ``values`` ([BLOCK] fp32 of the rounded residual sum, zeros
    past ``width``) into ``out`` at ``at``: ``add_zrms_row``'s norm, shared with the MoE launch that
    adds the sum in column blocks and normalises the stored row (tfd_kernels.moe_sum.finish_spread): one
    arithmetic, and in one layout one order of the squares' sum (on sm_90 fp32 rows still pair the
    squares into FMAs by where the values come from: tfd_kernels.moe_one keeps the last program there).
    ``w``: the norm's weight at those columns (``row_weight``)."""
    scaled = values * tl.rsqrt(tl.sum(values * values, axis=0) / width + eps)
    result = (scaled * (1.0 + w)).to(out.dtype.element_ty)
    tl.store(out + at, result, mask=mask)
    return result


@triton.jit
def add_zrms_row(x, delta, total, out, w, row, width, eps, BLOCK: tl.constexpr):
    """Row ``row`` of x + delta (``delta`` that row's values, [BLOCK] in the model dtype) into
    ``total``, and its zero-centred norm (``w`` its weight, ``row_weight``) into ``out``:
    ``_add_zrms``'s arithmetic, shared with the MoE's last launch (tfd_kernels.moe), whose sum it adds
    to the residual."""
    cols = tl.arange(0, BLOCK)
    mask = cols < width
    at = row * width + cols
    values = added(x, delta, at, mask, total.dtype.element_ty)
    tl.store(total + at, values, mask=mask)
    return zrms_row(values.to(tl.float32), out, w, at, mask, width, eps)


@triton.jit
def _add_zrms(x, delta, total, out, weight, q, scales, width, stride_q, stride_s, eps, BLOCK: tl.constexpr,
              EARLY: tl.constexpr, QUANTIZE: tl.constexpr, EXACT_CAST: tl.constexpr, PDL: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    if EARLY:  # the weight, which no kernel writes, asked for before the wait
        w = row_weight(weight, cols, cols < width)
    pdl.wait(PDL)
    if not EARLY:
        w = row_weight(weight, cols, cols < width)
    row = tl.program_id(0)
    delta_row = tl.load(delta + row * width + cols, mask=cols < width, other=0.0)
    normed = add_zrms_row(x, delta_row, total, out, w, row, width, eps, BLOCK)
    if QUANTIZE:
        fp8_rows.store_groups(normed.to(tl.float32), cols < width, q, scales, row * stride_q + cols,
                              row * stride_s, BLOCK // 128, EXACT_CAST)


def add_zrms(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
             rows: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, zrms(x + delta)) for [rows, width] rows in one pass: the residual stream and the
    next block's input; with ``rows``, the norm quantized there too (as ``zrms``'s)."""
    if x.dim() != 2 or delta.shape != x.shape or weight.shape != (x.shape[1],):
        raise ValueError(f"x {list(x.shape)}, delta {list(delta.shape)} and weight {list(weight.shape)} "
                         "must be [rows, width], [rows, width] and [width]")
    if rows is not None and not quantizes(x.shape[1]):
        raise ValueError(f"rows: a norm quantizes whole rows of a multiple of 128 columns, not {x.shape[1]}")
    x, delta = x.contiguous(), delta.contiguous()
    total, out = torch.empty_like(x), torch.empty_like(x)
    q, scales = fp8_rows.targets(rows, x.shape[0], x.shape[1], out)
    if x.shape[0]:
        block = triton.next_power_of_2(x.shape[1])
        _add_zrms[(x.shape[0],)](x, delta, total, out, weight, q, scales, x.shape[1], q.stride(0),
                                 scales.stride(0), eps, BLOCK=block, EARLY=WEIGHTS_EARLY,
                                 QUANTIZE=rows is not None, EXACT_CAST=INTERPRETED, num_warps=warps(block),
                                 **pdl.options(x.device))
    return total, out


@triton.jit
def _gated(x, gate, weight, out, q, scales, width, heads, x_row, gate_row, stride_q, stride_s, eps,
           ACTIVATION: tl.constexpr, HEADS: tl.constexpr, BLOCK: tl.constexpr, EARLY: tl.constexpr,
           QUANTIZE: tl.constexpr, EXACT_CAST: tl.constexpr, PDL: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    if EARLY:  # the weight, which no kernel writes, asked for before the wait
        w = tl.load(weight + cols, mask=cols < width, other=0.0)
    pdl.wait(PDL)
    if not EARLY:
        w = tl.load(weight + cols, mask=cols < width, other=0.0)
    row = tl.program_id(0)
    hs = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
    mask = (hs < heads)[:, None] & (cols < width)[None, :]
    at = hs[:, None] * width + cols[None, :]
    # the reference rounds the layer's output to the model dtype before the norm
    values = tl.load(x + row * x_row + at, mask=mask, other=0.0)
    values = values.to(out.dtype.element_ty).to(tl.float32)
    mean = tl.sum(values * values, axis=1) / width  # each head's own statistics
    normed = (values * tl.rsqrt(mean + eps)[:, None]).to(out.dtype.element_ty)
    weighted = (w.to(tl.float32)[None, :] * normed.to(tl.float32)).to(out.dtype.element_ty)
    g = tl.load(gate + row * gate_row + at, mask=mask, other=0.0).to(tl.float32)
    act = g / (1.0 + tl.exp(-g)) if ACTIVATION == 0 else 1.0 / (1.0 + tl.exp(-g))
    result = (weighted.to(tl.float32) * act).to(out.dtype.element_ty)
    tl.store(out + row * heads * width + at, result, mask=mask)
    if QUANTIZE:  # the program's heads lie side by side in the row: HEADS * BLOCK columns of whole groups
        groups: tl.constexpr = HEADS * BLOCK // 128
        fp8_rows.store_groups(result.to(tl.float32), mask, q, scales, row * stride_q + at,
                              row * stride_s + tl.program_id(1) * groups, groups, EXACT_CAST)


def _heads_packed(t: torch.Tensor) -> torch.Tensor:
    """``t`` [rows, heads, width] with heads and columns packed (any row stride), copied if not."""
    return t if t.stride(2) == 1 and t.stride(1) == t.shape[2] else t.contiguous()


def gated_rms(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
              activation: str, rows: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """RMSNorm of each head of ``x`` [rows, heads, width] times ``weight``, times act(``gate``);
    the result in ``gate``'s dtype (the model dtype), to which ``x`` is rounded first. One program a
    row and ``GATED_HEADS`` heads; x and gate are read in place when each row's heads are packed (a
    slice of a fused projection is). ``rows`` (``fp8_rows.empty_rows`` of [rows, heads * width]): the
    result quantized there too, as ``fp8_gemm.quantize`` would (``gated_quantizes``)."""
    if x.dim() != 3 or gate.shape != x.shape:
        raise ValueError(f"x {list(x.shape)} and gate {list(gate.shape)} must both be [rows, heads, width]")
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}")
    if rows is not None and not gated_quantizes(x.shape[2]):
        raise ValueError(f"rows: the gated norm quantizes heads of a power of two from {128 // GATED_HEADS} "
                         f"columns, not {x.shape[2]}")
    x, gate = _heads_packed(x), _heads_packed(gate)
    count, heads, width = x.shape
    out = torch.empty(count, heads, width, dtype=gate.dtype, device=gate.device)
    q, scales = fp8_rows.targets(rows, count, heads * width, out)
    if count:
        _gated[(count, triton.cdiv(heads, GATED_HEADS))](
            x, gate, weight, out, q, scales, width, heads, x.stride(0), gate.stride(0), q.stride(0),
            scales.stride(0), eps, ACTIVATION=ACTIVATIONS[activation], HEADS=GATED_HEADS,
            BLOCK=triton.next_power_of_2(width), EARLY=WEIGHTS_EARLY, QUANTIZE=rows is not None,
            EXACT_CAST=INTERPRETED, **pdl.options(x.device))
    return out


def gated_quantizes(width: int) -> bool:
    """Whether ``gated_rms`` can write heads of ``width`` quantized as well: a program's heads are whole
    128-wide groups (a power of two from 128 / GATED_HEADS)."""
    return width == triton.next_power_of_2(width) and GATED_HEADS * width % 128 == 0

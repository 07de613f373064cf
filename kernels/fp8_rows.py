"""Rows quantized where they are made: a kernel that writes a block of rows a block-wise FP8 product reads
next (a norm, SwiGLU's middle, the GDN output norm, attention decode's merge) writes them a second time as
that product reads them, so the product skips ``tfd_kernels.fp8_gemm.quantize``'s launch (a decode step
of the 9B ran 132 of them, 2-6 us each on the H100, beside products of 10-40 us).

The bits are ``quantize``'s: the values are the ones the kernel stores in the model dtype, widened back
to fp32, and quantized in 128-wide groups by the same code (``quantize_tile``, which
``fp8_gemm.quantize`` runs). A producer can do this where each of its programs holds whole groups: its
columns start at a multiple of 128 and run in 128-wide groups (each producer says where it can).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 128  # the activation group, the weight's scale block and every FP8 tile's K step
GROUP = tl.constexpr(BLOCK)  # the same, as the kernels read it
E4M3_MAX = tl.constexpr(448.0)  # e4m3's largest finite value (a constexpr: the kernels read it)


@triton.jit
def cast(v, dtype: tl.constexpr, EXACT_CAST: tl.constexpr):
    """``v`` (fp32) cast to ``dtype`` rounding to nearest, ties to even. With ``EXACT_CAST`` (the
    interpreter, whose casts get that wrong) the rounding is done here: bf16 is fp32's top half, its
    low half rounded away in the bits; e4m3 and fp16 values are rounded to their grid in fp32 (the
    low bits rounded away where dtype is normal, a carry moving into the exponent as it should; below
    that, adding and subtracting 1.5 times a power of two rounds to dtype's subnormal step), and the
    cast then only changes the type."""
    if EXACT_CAST and dtype != tl.float32:
        bits = v.to(tl.int32, bitcast=True)
        magnitude = bits & 0x7FFFFFFF
        if dtype == tl.bfloat16:
            top = ((magnitude + 0x7FFF + ((magnitude >> 16) & 1)) >> 16) | ((bits >> 16) & 0x8000)
            v = top.to(tl.uint16).to(tl.bfloat16, bitcast=True)
        else:
            drop: tl.constexpr = 23 - dtype.fp_mantissa_width
            low: tl.constexpr = 1 - dtype.exponent_bias  # dtype's smallest normal exponent
            magic: tl.constexpr = 1.5 * 2.0 ** (low - dtype.fp_mantissa_width + 23)
            normal = (magnitude + ((1 << (drop - 1)) - 1) + ((magnitude >> drop) & 1)) & -(1 << drop)
            rounded = tl.where((magnitude >> 23) - 127 >= low, normal.to(tl.float32, bitcast=True),
                               (tl.abs(v) + magic) - magic)
            v = tl.where(bits < 0, -rounded, rounded)  # the sign kept, -0 included
    return v.to(dtype)


@triton.jit
def quantize_tile(a, valid, EXACT_CAST: tl.constexpr):
    """Rows of 128-wide groups ``a`` (fp32 [R, BLOCK], zeros where not ``valid``) quantized: (q e4m3 [R,
    BLOCK], scales fp32 [R]), one group a row. Shared by ``quantize`` and the kernels that quantize the
    rows they make (``store_groups``), so both give the same bits."""
    amax = tl.max(tl.abs(a), axis=1)
    # A zero dividend takes div.rn's slow path on the GPU: masked rows and columns divide a one instead
    # (their results are not kept). Unmasked, a row among a tile's 32 padded ones quantized in 6.0 us
    # against 2.3 for 32 rows, the same grid and work (H100, fp8-diag-9b.txt).
    positive = amax > 0
    scale = tl.math.div_rn(tl.where(positive, amax, E4M3_MAX), tl.full(amax.shape, E4M3_MAX, tl.float32))
    scale = tl.where(positive & (scale > 0), scale, 1.0)  # zero or underflowed: q = 0 rather than NaN
    q = tl.math.div_rn(tl.where(valid, a, 1.0), tl.broadcast_to(scale[:, None], a.shape))
    q = tl.where(valid, q, 0.0)
    # the quotient may land one rounding above 448, which e4m3fn has no value for
    q = tl.clamp(q, -E4M3_MAX, E4M3_MAX)
    return cast(q, tl.float8e4nv, EXACT_CAST), scale


@triton.jit
def store_groups(values, valid, q, scales, at, first_group, GROUPS: tl.constexpr, EXACT_CAST: tl.constexpr):
    """``values`` (fp32 of the stored values, any shape of ``GROUPS`` x 128 elements, zeros where not
    ``valid``), consecutive 128-wide groups in row-major order, quantized: the codes stored at ``q + at``
    (``at`` shaped as ``values``), the groups' scales at ``scales + first_group`` onwards. A group with no
    valid element stores no scale."""
    a = tl.reshape(values, (GROUPS, GROUP))
    live = tl.reshape(valid, (GROUPS, GROUP))
    codes, scale = quantize_tile(a, live, EXACT_CAST)
    tl.store(q + at, tl.reshape(codes, values.shape), mask=valid)
    touched = tl.max(live.to(tl.int32), axis=1) > 0
    tl.store(scales + first_group + tl.arange(0, GROUPS), scale, mask=touched)


def empty_rows(rows: int, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Room for ``rows`` rows of ``width`` quantized: (q float8_e4m3fn [rows, width], scales float32
    [rows, ceil(width / 128)]), as ``fp8_gemm.product`` takes them."""
    return (torch.empty(rows, width, dtype=torch.float8_e4m3fn, device=device),
            torch.empty(rows, triton.cdiv(width, BLOCK), dtype=torch.float32, device=device))


def targets(rows: tuple[torch.Tensor, torch.Tensor] | None, count: int, width: int, stand_in: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Where a producer writes its rows quantized: ``rows`` checked (``check_rows``, on ``stand_in``'s
    device), or ``stand_in`` twice where it is asked for none (pointers its launch never reads)."""
    if rows is None:
        return stand_in, stand_in
    check_rows(rows, count, width, stand_in.device)
    return rows


def check_rows(rows: tuple[torch.Tensor, torch.Tensor], count: int, width: int, device: torch.device) -> None:
    """ValueError naming ``rows`` unless it is ``empty_rows(count, width, device)``'s kind of pair."""
    q, scales = rows
    groups = triton.cdiv(width, BLOCK)
    wrong_q = q.dtype != torch.float8_e4m3fn or tuple(q.shape) != (count, width) or q.stride(1) != 1
    wrong_scales = scales.dtype != torch.float32 or tuple(scales.shape) != (count, groups) \
        or scales.stride(1) != 1
    if wrong_q or wrong_scales or q.device != device or scales.device != device:
        raise ValueError(f"rows must be float8_e4m3fn [{count}, {width}] and float32 [{count}, {groups}] on "
                         f"{device}, not {q.dtype} {tuple(q.shape)} and {scales.dtype} {tuple(scales.shape)}")

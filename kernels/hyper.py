"""Flash Next's hyper-connections around their products (``tfd.model.hyper``), a launch each.

A read normalises the streams (``tfd_kernels.norm.zrms``), multiplies them by the mix's down rows
and, for a layer's two modules, the injection rows in one product, then: ``gates`` turns that
product into the mix's hidden values ``silu(p / streams)`` and the injection weights
``2 * sigmoid(p / streams)``; after the up product, ``block_input`` takes each stream's
``sigmoid(up) * normed`` and their mean (``tfd_kernels.hyper_mix`` does the three in one launch).
``write`` adds the block's output to every stream times its weight; ``write_norm`` also
normalises the streams it writes, the next read's first step, in the same launch
(``tfd.model.hyper.read_after``). In torch these are about 25 launches a read and 2 a write; at a
decode step's few rows each is a launch gap (Flash Next's one-stream step was 35% of its roofline).

The cast points are the torch composition's in the model dtype: the division by ``streams``
rounded, the activation in fp32 rounded, each product rounded, the mean summed in fp32 in stream
order and divided, then rounded; the write's product rounded, then the sum. The activations are
the other kernels' (``conv1d.silu_out``, ``sigmoid_gate.gated``), rounded the same way. Elementwise
along a row (the mean over a row's own streams), so a row's bits never depend on the others.

Memory: each reads its inputs once and writes one new contiguous output. Grids follow the shapes
alone (no host sync), so calls can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import norm as norm_kernels
from tfd_kernels import pdl
from tfd_kernels.conv1d import silu_out
from tfd_kernels.sigmoid_gate import gated, widened

BLOCK = 1024


def unit_columns(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself where its columns are adjacent (any row stride), else a contiguous copy."""
    return t if t.stride(1) == 1 else t.contiguous()


@triton.jit
def divided(p, streams, dtype: tl.constexpr):
    """``p / streams`` rounded to the model dtype, in fp32: what the gates' activations take."""
    return (p.to(tl.float32) / streams).to(dtype).to(tl.float32)


@triton.jit
def injection(scaled, dtype: tl.constexpr):
    """The injection weights ``2 * sigmoid(scaled)``, rounded as ``sigmoid_gate.gated`` rounds."""
    return gated(tl.full(scaled.shape, 2.0, tl.float32), scaled, dtype)


@triton.jit
def _gates(projected, mixed, weights, rank, width, streams, stride_p, INJECTS: tl.constexpr,
           BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    dtype = mixed.dtype.element_ty
    value = tl.load(projected + row * stride_p + cols, mask=cols < width, other=0.0)
    scaled = divided(value, streams, dtype)
    tl.store(mixed + row * rank + cols, silu_out(scaled, dtype), mask=cols < rank)
    if INJECTS:
        injected = injection(scaled, dtype)
        past = (cols >= rank) & (cols < width)
        tl.store(weights + row * (width - rank) + (cols - rank), injected, mask=past)


def gates(projected: torch.Tensor, rank: int, streams: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """From ``projected`` [rows, rank (+ streams)] (the down rows' product, then the injection
    rows'): ``silu(p / streams)`` of the first ``rank`` columns [rows, rank] and, where there are
    more, ``2 * sigmoid(p / streams)`` of the rest [rows, streams]; None for weights otherwise."""
    if projected.dim() != 2 or projected.shape[1] not in (rank, rank + streams):
        raise ValueError(f"projected is {list(projected.shape)}: want [rows, {rank}] or [rows, "
                         f"{rank + streams}]")
    projected = unit_columns(projected)
    rows, width = projected.shape
    injects = width > rank
    mixed = torch.empty(rows, rank, dtype=projected.dtype, device=projected.device)
    weights = torch.empty(rows, streams, dtype=projected.dtype, device=projected.device) if injects else None
    if rows:
        _gates[(rows, triton.cdiv(width, BLOCK))](
            projected, mixed, mixed if weights is None else weights, rank, width, float(streams),
            projected.stride(0), INJECTS=injects, BLOCK=BLOCK, **pdl.options(projected.device))
    return mixed, weights


@triton.jit
def _block_input(up, normed, out, width, stride_u, stride_n, STREAMS: tl.constexpr,
                 BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    dtype = out.dtype.element_ty
    total = tl.zeros((BLOCK,), tl.float32)
    for stream in tl.static_range(STREAMS):  # in stream order, as torch's mean over them
        at = stream * width + cols
        value = tl.load(normed + row * stride_n + at, mask=mask, other=0.0)
        total += gated(value, tl.load(up + row * stride_u + at, mask=mask, other=0.0), dtype).to(tl.float32)
    tl.store(out + row * width + cols, (total / STREAMS).to(dtype), mask=mask)


def block_input(up: torch.Tensor, normed: torch.Tensor, streams: int, width: int) -> torch.Tensor:
    """The block's input [rows, width]: over the streams, the mean of ``sigmoid(up) * normed``
    (``up`` and ``normed`` [rows, streams * width])."""
    if up.shape != normed.shape or up.dim() != 2 or up.shape[1] != streams * width:
        raise ValueError(f"up {list(up.shape)} and normed {list(normed.shape)}: want both "
                         f"[rows, {streams * width}]")
    up, normed = unit_columns(up), unit_columns(normed)
    rows = up.shape[0]
    out = torch.empty(rows, width, dtype=normed.dtype, device=normed.device)
    if rows:
        _block_input[(rows, triton.cdiv(width, BLOCK))](
            up, normed, out, width, up.stride(0), normed.stride(0), STREAMS=streams, BLOCK=BLOCK,
            **pdl.options(up.device))
    return out


@triton.jit
def _written(base, value, weight, dtype: tl.constexpr):
    """A stream's ``base`` plus the block's ``value`` times its ``weight`` (all fp32): the product
    rounded to ``dtype``, then the sum, rounded."""
    return (base + widened((value * weight).to(dtype))).to(dtype)


@triton.jit
def _write(stack, output, weights, out, width, stride_s, stride_o, stride_w, STREAMS: tl.constexpr,
           BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    dtype = out.dtype.element_ty
    value = tl.load(output + row * stride_o + cols, mask=mask, other=0.0).to(tl.float32)
    for stream in tl.static_range(STREAMS):
        weight = tl.load(weights + row * stride_w + stream).to(tl.float32)
        at = stream * width + cols
        base = tl.load(stack + row * stride_s + at, mask=mask, other=0.0).to(tl.float32)
        tl.store(out + row * STREAMS * width + at, _written(base, value, weight, dtype), mask=mask)


def _write_shapes(stack: torch.Tensor, output: torch.Tensor, weights: torch.Tensor,
                  norm: torch.Tensor | None = None) -> tuple[int, int, int]:
    """(rows, streams, width) of a write's inputs (and its norm's weight); ValueError naming them."""
    rows, streams = weights.shape
    width = output.shape[-1]
    named = f"stack {list(stack.shape)}, output {list(output.shape)}, weights {list(weights.shape)}"
    wanted = "[rows, streams * width], [rows, width], [rows, streams]"
    wrong = stack.shape != (rows, streams * width) or output.shape != (rows, width)
    if norm is not None:
        named, wanted = f"{named}, norm {list(norm.shape)}", f"{wanted}, [streams * width]"
        wrong = wrong or norm.shape != (streams * width,)
    if wrong:
        raise ValueError(f"{named}: want {wanted}")
    return rows, streams, width


def write(stack: torch.Tensor, output: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``stack`` [rows, streams * width] with the block ``output`` [rows, width] added to each stream
    times its weight (``weights`` [rows, streams]), as a new tensor."""
    rows, streams, width = _write_shapes(stack, output, weights)
    stack, output, weights = unit_columns(stack), unit_columns(output), unit_columns(weights)
    out = torch.empty(rows, streams * width, dtype=stack.dtype, device=stack.device)
    if rows:
        _write[(rows, triton.cdiv(width, BLOCK))](
            stack, output, weights, out, width, stack.stride(0), output.stride(0), weights.stride(0),
            STREAMS=streams, BLOCK=BLOCK, **pdl.options(stack.device))
    return out


@triton.jit
def _write_norm(stack, output, weights, norm, out, normed, width, stride_s, stride_o, stride_w, eps,
                BLOCK: tl.constexpr, PDL: tl.constexpr):
    """A program a row and stream: ``_write``'s sum for the stream, stored, then ``norm.zrms``'s
    arithmetic on it (the rounded values in fp32, their squares summed over the block as a norm
    program sums them), stored."""
    pdl.wait(PDL)
    row, stream = tl.program_id(0), tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    mask = cols < width
    dtype = out.dtype.element_ty
    at = stream * width + cols
    value = tl.load(output + row * stride_o + cols, mask=mask, other=0.0).to(tl.float32)
    weight = tl.load(weights + row * stride_w + stream).to(tl.float32)
    base = tl.load(stack + row * stride_s + at, mask=mask, other=0.0).to(tl.float32)
    total = _written(base, value, weight, dtype)
    tl.store(out + row * tl.num_programs(1) * width + at, total, mask=mask)
    w = norm_kernels.row_weight(norm + stream * width, cols, mask)
    row_out = normed + row * tl.num_programs(1) * width
    norm_kernels.zrms_row(total.to(tl.float32), row_out, w, at, mask, width, eps)


def write_norm(stack: torch.Tensor, output: torch.Tensor, weights: torch.Tensor, norm: torch.Tensor,
               eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``write(stack, output, weights)`` and the zero-centred norm of each of its streams (``norm``
    [streams * width], each stream's own weight), in one launch: the next read's first step."""
    rows, streams, width = _write_shapes(stack, output, weights, norm)
    stack, output, weights = unit_columns(stack), unit_columns(output), unit_columns(weights)
    out = torch.empty(rows, streams * width, dtype=stack.dtype, device=stack.device)
    normed = torch.empty_like(out)
    if rows:
        block = triton.next_power_of_2(width)
        _write_norm[(rows, streams)](stack, output, weights, norm, out, normed, width, stack.stride(0),
                                     output.stride(0), weights.stride(0), eps, BLOCK=block,
                                     num_warps=norm_kernels.warps(block), **pdl.options(stack.device))
    return out, normed

"""The last step of an MoE block (``tfd_kernels.moe``): a row's ranked expert outputs (rows of the experts'
buffer in the model dtype, ``top_k`` a row in ascending expert id, then the shared expert's rows after every
routed one) summed in that order in fp32 and rounded, plus the shared expert's output times sigmoid(gate)
rounded as ``tfd_kernels.sigmoid_gate`` rounds it; ``combine_add_zrms`` also adds the residual stream and
normalises the sum for the next block as ``tfd_kernels.norm.add_zrms`` does (the same bits, one launch).
``combined`` is the row arithmetic, shared with the experts' own last program at one row; ``finish_spread`` is
that work at one row spread over the experts' last programs of each column block.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import gemm, norm, pdl
from tfd_kernels.sigmoid_gate import gated, widened

COMBINE_N = 256  # hidden columns of a combining program


@triton.jit
def combined(buf, gate, row, cols, pairs, hidden, stride_g, TOP_K: tl.constexpr, SHARED: tl.constexpr,
             dtype: tl.constexpr, GATE_SEGMENTS: tl.constexpr):
    """Row ``row``'s block output at ``cols``: its ranks summed in order and rounded, plus the gated
    shared expert. With ``GATE_SEGMENTS`` (one row), ``gate`` is the router product's fp32 partials at
    the gate's column, ``stride_g`` apart: the gate is their sum in order, rounded as the product's."""
    total = tl.zeros(cols.shape, dtype=tl.float32)
    # Unrolled, so every rank's load is in flight at once (a loop waited out each in turn: 6.9 us a
    # row at one row); the adds stay in ascending expert id, the same order for every row.
    # (.cg: from L2, where another program's stores are, whichever launch made them)
    for rank in tl.static_range(TOP_K):
        total += tl.load(buf + (row * TOP_K + rank) * hidden + cols, mask=cols < hidden, other=0.0,
                         cache_modifier=".cg").to(tl.float32)
    result = total.to(dtype)
    if SHARED:  # + the shared expert's output (rounded as a linear's) * sigmoid(gate), as sigmoid_gate rounds
        value = tl.load(buf + (pairs + row) * hidden + cols, mask=cols < hidden, other=0.0,
                        cache_modifier=".cg").to(dtype)
        if GATE_SEGMENTS > 0:
            g = gemm.summed(gate, stride_g, 0, True, GATE_SEGMENTS).to(dtype)
        else:
            g = tl.load(gate + row * stride_g)
        part = gated(value, g, dtype)
        result = (result.to(tl.float32) + widened(part)).to(dtype)
    return result


@triton.jit
def _combine(buf, out, gate, pairs, hidden, stride_o, stride_g, TOP_K: tl.constexpr, SHARED: tl.constexpr,
             BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    result = combined(buf, gate, row, cols, pairs, hidden, stride_g, TOP_K, SHARED, out.dtype.element_ty, 0)
    tl.store(out + row * stride_o + cols, result, mask=cols < hidden)


@triton.jit
def _combine_add_zrms(buf, gate, residual, total, out, weight, pairs, hidden, stride_g, eps,
                      TOP_K: tl.constexpr, SHARED: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """``_combine``'s row added to the residual and normalised, as ``tfd_kernels.norm.add_zrms`` does."""
    pdl.wait(PDL)
    combined_add_zrms(buf, gate, residual, total, out, weight, tl.program_id(0).to(tl.int64), pairs, hidden,
                      stride_g, eps, TOP_K, SHARED, BLOCK, 0)


@triton.jit
def combined_add_zrms(buf, gate, residual, total, out, weight, row, pairs, hidden, stride_g, eps,
                      TOP_K: tl.constexpr, SHARED: tl.constexpr, BLOCK: tl.constexpr,
                      GATE_SEGMENTS: tl.constexpr):
    """Row ``row``'s block output (``combined``) added to the residual into ``total`` and normalised
    into ``out`` (``tfd_kernels.norm.add_zrms_row``): the work of ``_combine_add_zrms``'s program, shared
    with the experts' own last program at one row (tfd_kernels.moe, tfd_kernels.moe_one)."""
    delta = combined(buf, gate, row, tl.arange(0, BLOCK), pairs, hidden, stride_g, TOP_K, SHARED,
                     total.dtype.element_ty, GATE_SEGMENTS)
    cols = tl.arange(0, BLOCK)
    w = norm.row_weight(weight, cols, cols < hidden)
    norm.add_zrms_row(residual, delta, total, out, w, row, hidden, eps, BLOCK)


@triton.jit
def finish_spread(buf, gate, residual, total, out, weight, blocks, finished, column, tiles, columns, pairs,
                  hidden, stride_g, eps, TOP_K: tl.constexpr, SHARED: tl.constexpr, ADD_NORM: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK: tl.constexpr, GATE_SEGMENTS: tl.constexpr):
    """``combined_add_zrms``'s work at one row (without ``ADD_NORM``, ``combined``'s into ``total``)
    spread over the down programs that wrote ``buf``: ``tiles`` of them a block of ``BLOCK_N``
    columns, ``columns`` blocks; a program calls it once its columns of ``buf`` are stored and a
    barrier has seen every thread's part. The last of a block's programs (its ``blocks`` counter)
    sums the block's columns (elementwise, so the same bits as the whole row at once), adds the
    residual and stores them into ``total``; the last of those (``finished``) normalises the stored
    row as ``tfd_kernels.norm.add_zrms_row`` does. True for that last program; each counter is rearmed
    by the program that completes it."""
    last = column < 0  # false, of the counts' scalar type
    if tl.atomic_add(blocks + column, 1, sem="acq_rel", scope="gpu") == tiles - 1:
        cols = column * BLOCK_N + tl.arange(0, BLOCK_N)
        dtype = total.dtype.element_ty
        delta = combined(buf, gate, 0, cols, pairs, hidden, stride_g, TOP_K, SHARED, dtype, GATE_SEGMENTS)
        if ADD_NORM:  # rounded to the model dtype as add_zrms_row rounds the residual sum
            delta = norm.added(residual, delta, cols, cols < hidden, dtype)
        tl.store(total + cols, delta, mask=cols < hidden)
        tl.atomic_xchg(blocks + column, 0, sem="relaxed", scope="gpu")  # every program of the block counted
        tl.debug_barrier()  # every thread's columns of total are stored before the block counts
        last = tl.atomic_add(finished, 1, sem="acq_rel", scope="gpu") == columns - 1
        if last:
            if ADD_NORM:  # the whole row from L2, as rounded and stored: the norm's bits from the same values
                every = tl.arange(0, BLOCK)
                values = tl.load(total + every, mask=every < hidden, other=0.0, cache_modifier=".cg")
                w = norm.row_weight(weight, every, every < hidden)
                norm.zrms_row(values.to(tl.float32), out, w, every, every < hidden, hidden, eps)
            tl.atomic_xchg(finished, 0, sem="relaxed", scope="gpu")  # every block counted
    return last


def combine(buf: torch.Tensor, out: torch.Tensor, gate: torch.Tensor, pairs: int, top_k: int,
            shared: bool) -> None:
    """Each row of ``out`` [rows, hidden] from ``buf`` (``gate`` [rows, 1] read with ``shared``)."""
    rows, hidden = out.shape
    _combine[(rows, triton.cdiv(hidden, COMBINE_N))](
        buf, out, gate, pairs, hidden, out.stride(0), gate.stride(0), TOP_K=top_k, SHARED=shared,
        BLOCK_N=COMBINE_N, **pdl.options(out.device))


def combine_add_zrms(buf: torch.Tensor, gate: torch.Tensor, residual: torch.Tensor, total: torch.Tensor,
                     out: torch.Tensor, weight: torch.Tensor, pairs: int, top_k: int, shared: bool,
                     eps: float) -> None:
    """``total`` = ``residual`` + each row's sum, ``out`` = its zero-centred norm (``weight``, ``eps``),
    a program a row, in ``tfd_kernels.norm``'s warps for the row's width."""
    rows, hidden = total.shape
    block = triton.next_power_of_2(hidden)
    _combine_add_zrms[(rows,)](buf, gate, residual, total, out, weight, pairs, hidden, gate.stride(0), eps,
                               TOP_K=top_k, SHARED=shared, BLOCK=block, num_warps=norm.warps(block),
                               **pdl.options(total.device))

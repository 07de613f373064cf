"""The two products of an MoE expert tile (``tfd_kernels.moe``), shared by the two-launch form and the
one-launch form at one row (``tfd_kernels.moe_one``): a tile is up to ``BLOCK_M`` pairs of one expert.

``gate_up_tile``: h = silu(x @ gate.T) * (x @ up.T) for a tile's pairs over ``BLOCK_N`` of the
expert's inner columns, in fp32 and stored in the model dtype. ``down_tile``: h @ down.T over
``BLOCK_N`` hidden columns, times the pair's routing weight, into the pair's buffer row. Both
walk K in ``BLOCK_K`` steps in order from zero, so either form gives the same bits. Their FP8 twins,
and the choice of a tile's kind, are ``tfd_kernels.moe_fp8``'s.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def dot(a, b, acc, PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """``acc + a @ b.T``."""
    if WIDEN:  # the interpreter's bf16 dot is wrong (kernels/__init__.py); fp32 holds the products exactly
        a, b = a.to(tl.float32), b.to(tl.float32)
    return tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)


@triton.jit
def weight_of(routed, shared, expert, experts, stride_e, stride_n, stride_sn, inner, shared_inner):
    """An expert's matrix, its row stride and inner size: the shared expert (id ``experts``) has its own."""
    own = expert == experts
    matrix = tl.where(own, shared, routed + expert.to(tl.int64) * stride_e)
    return matrix, tl.where(own, stride_sn, stride_n), tl.where(own, shared_inner, inner)


@triton.jit
def gate_up_tile(x, gate, stride_n, size, h, q, live, token, hidden, width, stride_x, column_tile,
                 PRECISION: tl.constexpr, WIDEN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """The middle h of pairs ``q`` (rows ``token`` of x; ``live`` the real ones) over the expert's
    inner columns of tile ``column_tile``, from its ``gate`` matrix (gate rows, then ``size`` up rows)."""
    cols = column_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    gate = gate + cols[:, None] * stride_n
    up = gate + size * stride_n
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, hidden, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        wmask = (cols[:, None] < size) & (ks[None, :] < hidden)
        a = tl.load(x + token[:, None] * stride_x + ks[None, :], mask=live[:, None] & (ks[None, :] < hidden),
                    other=0.0)
        acc_gate = dot(a, tl.load(gate + ks[None, :], mask=wmask, other=0.0), acc_gate, PRECISION, WIDEN)
        acc_up = dot(a, tl.load(up + ks[None, :], mask=wmask, other=0.0), acc_up, PRECISION, WIDEN)
    store_middle(acc_gate, acc_up, h, q, live, cols, size, width)


@triton.jit
def store_middle(acc_gate, acc_up, h, q, live, cols, size, width):
    """A gate/up tile's end, whatever its weights' kind: silu(gate) * up in fp32, stored in h's dtype
    (pairs ``q``, inner columns ``cols`` below the expert's ``size``)."""
    act = acc_gate / (1.0 + tl.exp(-acc_gate)) * acc_up
    tl.store(h + q[:, None] * width + cols[None, :], act.to(h.dtype.element_ty),
             mask=live[:, None] & (cols[None, :] < size))


@triton.jit
def down_tile(h, w, stride_n, size, buf, q, live, weight, dest, hidden, width, column_tile,
              PRECISION: tl.constexpr, WIDEN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, H_CACHE: tl.constexpr):
    """Pairs ``q``'s h times the expert's down matrix ``w`` over hidden columns of tile
    ``column_tile``, times each pair's fp32 ``weight``, into buffer rows ``dest``. ``H_CACHE``: the
    cache modifier of h's loads (".cg" where another program of the same launch stored it)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, size, BLOCK_K):
        b = down_weights(w, stride_n, size, hidden, column_tile, start, BLOCK_N, BLOCK_K)
        acc = down_step(h, b, acc, q, live, width, size, start, PRECISION, WIDEN, BLOCK_K, H_CACHE)
    down_store(buf, acc, live, weight, dest, hidden, column_tile, BLOCK_N)


@triton.jit
def down_store(buf, acc, live, weight, dest, hidden, column_tile, BLOCK_N: tl.constexpr):
    """A down tile's sum times each pair's fp32 ``weight`` into buffer rows ``dest``, rounded to the
    buffer's dtype (the model's)."""
    cols = column_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    term = (acc * weight[:, None]).to(buf.dtype.element_ty)
    tl.store(buf + dest[:, None].to(tl.int64) * hidden + cols[None, :], term,
             mask=live[:, None] & (cols[None, :] < hidden))


@triton.jit
def down_weights(w, stride_n, size, hidden, column_tile, start, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """K step ``start`` of a down tile's weights (zeros past the expert's inner ``size``)."""
    cols = column_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = start + tl.arange(0, BLOCK_K)
    live = (cols[:, None] < hidden) & (ks[None, :] < size)
    return tl.load(w + cols[:, None] * stride_n + ks[None, :], mask=live, other=0.0)


@triton.jit
def down_step(h, b, acc, q, live, width, size, start, PRECISION: tl.constexpr, WIDEN: tl.constexpr,
              BLOCK_K: tl.constexpr, H_CACHE: tl.constexpr):
    """``down_tile``'s step at K offset ``start``: ``acc`` plus h's K tile times the weights ``b``."""
    ks = start + tl.arange(0, BLOCK_K)
    a = tl.load(h + q[:, None] * width + ks[None, :], mask=live[:, None] & (ks[None, :] < size), other=0.0,
                cache_modifier=H_CACHE)
    return dot(a, b, acc, PRECISION, WIDEN)


@triton.jit
def down_four(h, b0, b1, b2, b3, q, live, width, size, PRECISION: tl.constexpr, WIDEN: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``down_tile``'s sum over an inner size of four K steps, their weights ``b0``..``b3`` loaded
    (``down_weights``); h stored by another program of the launch (read through L2)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = down_step(h, b0, acc, q, live, width, size, 0, PRECISION, WIDEN, BLOCK_K, ".cg")
    acc = down_step(h, b1, acc, q, live, width, size, BLOCK_K, PRECISION, WIDEN, BLOCK_K, ".cg")
    acc = down_step(h, b2, acc, q, live, width, size, 2 * BLOCK_K, PRECISION, WIDEN, BLOCK_K, ".cg")
    return down_step(h, b3, acc, q, live, width, size, 3 * BLOCK_K, PRECISION, WIDEN, BLOCK_K, ".cg")

"""Phase one of the GDN prefill (kernels/gdn_prefill.py): every chunk's state-free part, all in parallel.

Programs run over (chunk slot, value head, role) for the chunks of every live lane of the launch; a
slot finds its lane and chunk from the lanes' chunk offsets. A chunk's tile holds lane row i at tile
row (starts[b] + i) % CHUNK, as phase two walks it. Role 0 forms the strictly lower
a = beta K K^T o D and T = (I + a)^-1, then W and U; role 1 forms P and the row factors. It writes,
for the chunk's own rows only, all fp32 (|x|^-1 is rsqrt(sum(x^2) + 1e-6), the normalisation of q and
k):

    w   [rows, value_heads, key_dim]    W = T (beta e^G K)                          role 0
    u   [rows, value_heads, value_dim]  U = T (beta V)                              role 0
    tri [rows, value_heads, CHUNK]      a, read back by the solve (scratch)         role 0
    p   [rows, value_heads, CHUNK]      P = Q K^T o D, zero above the diagonal      role 1
    f   [3, rows, value_heads]          scale e^G |q|^-1, e^(G_last - G) |k|^-1, G  role 1

and reads only q, k, v, g, beta and the lanes' bounds; padding lanes have no chunks.

Registers: products are tf32x3 on tensor cores, which hold a register operand twice (its tf32 part
and the rest), so each product's register operand is one [CHUNK, PIECE] piece or T; a is parked in
``tri`` and its blocks read back rather than held; the roles split what one program would hold; and a
barrier ends each stage, so the compiler neither holds a stage's loads into the next nor hoists the
next stage's. ptxas (offline, sm_90a, the real dims, bf16 inputs, the pointers and row strides
divisible by 16 as the launcher's are) then spills nothing. Tried and dropped (H100, 2026-12-05): the
doubling's levels inside 16- or 32-row diagonal blocks run on those blocks alone, batched (fewer wgmma,
the same bits, but 3.5 or 1.6 KB of spills: 1.89 or 2.34 ms for 8 x 1,024 rows of 32 heads against 1.58).

Rounding: T is the diagonal blocks' inverse doubled up to CHUNK rows, X <- X - X a' X with a' the
lower left blocks. Each step is block substitution's T_21 = -T_22 A_21 T_11 on blocks already
inverted, the elimination of substitution row by row with the sums in another order; no powers of a
are formed. Q K^T and K K^T are products of the raw rows, scaled after by the rows' and columns'
|x|^-1; 16-bit inputs are exact in tf32, so those take one tf32 pass. Every shape follows the head
dims alone, and a chunk's bits depend only on its own rows and their tile rows.
"""

from __future__ import annotations

import triton
import triton.language as tl

# tf32x3 keeps near-fp32 accuracy on tensor cores (three tf32 passes); plain tf32 would lose ~3 digits.
PRECISION = tl.constexpr("tf32x3")
# Key or value dims a product's register operand holds (both phases): [64, 64] wgmma operands; ptxas
# spilled at 32 (more partial results live) and would at 128 (the whole head).
PIECE = 64
LANES_BLOCK = 128  # lanes' chunk offsets read at a time when a program looks for its lane
NUM_WARPS = 4  # one warpgroup: at 8, Triton splits tf32x3 products over two mma layouts and spills
# T by the doubling in one tf32 pass, then one Newton step (X + X E, E = I - X - a X, X cut to tf32 bits so
# that a X takes two passes, X E one), and W, U as T's columns scaled times the raw 16-bit rows in two
# passes: 23 tensor-core passes a chunk against tf32x3's 44; phases two and three's products of raw rows
# (K^T V', Q S) in two passes too; within a few times tf32x3's error (emulated,
# docs/bench/kit/gdn_precision.py: 2.9e-7 and 1.1e-6 of the output against 8e-8 and 1.6e-7; one pass
# everywhere, 5.6e-4 and 1.2e-3). On: H100, 8 x 1,024 rows of the MoE shapes' heads, the three launches
# 2.43 -> 1.37 ms; Flash Next's 1 x 1,024 prefill no slower (2026-12-06, docs/bench.md). The same values as
# tf32x3's within REAL_TOL, other bits: False gives those.
REFINED = True


@triton.jit
def dot(a, b, acc=None):
    return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def _cut(x):
    """``x`` (fp32) cut to tf32's bits, exact in one tf32 pass."""
    return (x.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)


@triton.jit
def _two_pass(a, b):
    """a @ b for ``b`` exact in tf32: a's tf32 bits, then the rest, a tf32 pass each (tf32x3 less its
    pass of b's rest, which is zero)."""
    high = _cut(a)
    return tl.dot(a - high, b, tl.dot(high, b, input_precision="tf32"), input_precision="tf32")


@triton.jit
def exact_left_dot(a, b, acc, like, SPLIT: tl.constexpr):
    """``acc + a @ b`` for raw rows ``a`` of a tensor like ``like``: with ``SPLIT`` and 16-bit rows (exact
    in tf32), b's tf32 bits and the rest a tf32 pass each, else at PRECISION."""
    if SPLIT and like.dtype.element_ty != tl.float32:
        high = _cut(b)
        return tl.dot(a, b - high, tl.dot(a, high, acc, input_precision="tf32"), input_precision="tf32")
    return dot(a, b, acc)


@triton.jit
def _scaled_dot(x, scale, y, like):
    """``x @ (scale[:, None] * y)`` for raw rows ``y`` of a tensor like ``like``: as ``x``'s columns scaled
    times y in two passes where y is 16-bit (exact in tf32), else at PRECISION."""
    if like.dtype.element_ty == tl.float32:
        return dot(x, scale[:, None] * y)
    return _two_pass(x * scale[None, :], y)


@triton.jit
def _raw_dot(a, b, acc, like):
    """A product of raw rows loaded from a tensor like ``like``: 16-bit floats are exact in tf32, so one
    tf32 pass multiplies them exactly (the accumulation is fp32 either way); fp32 rows take PRECISION."""
    if like.dtype.element_ty == tl.float32:
        return tl.dot(a, b, acc, input_precision=PRECISION)
    return tl.dot(a, b, acc, input_precision="tf32")


@triton.jit
def _load(ptr, r, stride, live, cols, col_live):
    """Rows ``r`` (masked by ``live``) of a [rows, ...] tensor at ``ptr``, columns ``cols``, as fp32."""
    return tl.load(ptr + r[:, None] * stride + cols[None, :], mask=live[:, None] & col_live[None, :],
                   other=0.0).to(tl.float32)


@triton.jit
def _store(ptr, r, stride, live, cols, col_live, x):
    tl.store(ptr + r[:, None] * stride + cols[None, :], x, mask=live[:, None] & col_live[None, :])


@triton.jit
def _rnorm(x, stride, r, live, DIM: tl.constexpr, BLOCK: tl.constexpr, PIECE: tl.constexpr):
    """rsqrt(sum(x^2) + 1e-6) of rows ``r`` of the head at ``x`` ([rows, DIM]), a piece at a time."""
    ps = tl.arange(0, PIECE)
    square = tl.zeros([r.shape[0]], tl.float32)
    for n in tl.static_range(BLOCK // PIECE):
        y = _load(x + n * PIECE, r, stride, live, ps, n * PIECE + ps < DIM)
        square += tl.sum(y * y, axis=1)
    return tl.rsqrt(square + 1e-6)


@triton.jit
def _gram(x, x_row, y, y_row, r, live, DIM: tl.constexpr, BLOCK: tl.constexpr, PIECE: tl.constexpr):
    """X Y^T of the raw rows ``r`` of the heads at ``x`` and ``y``, a piece of dims at a time."""
    ps = tl.arange(0, PIECE)
    acc = tl.zeros([r.shape[0], r.shape[0]], tl.float32)
    for n in tl.static_range(BLOCK // PIECE):
        col_live = n * PIECE + ps < DIM
        acc = _raw_dot(_load(x + n * PIECE, r, x_row, live, ps, col_live),
                       tl.trans(_load(y + n * PIECE, r, y_row, live, ps, col_live)), acc, x)
    return acc


@triton.jit
def _decay(total, t, STRICT: tl.constexpr):
    """D: exp(G_i - G_j) below the diagonal (and on it unless ``STRICT``), else exp(-inf) = 0, so
    G_i - G_j > 0 above it never overflows."""
    lower = t[:, None] > t[None, :] if STRICT else t[:, None] >= t[None, :]
    return tl.exp(tl.where(lower, total[:, None] - total[None, :], float("-inf")))


@triton.jit
def lane_of(chunk_at, slot, lanes, LANES_BLOCK: tl.constexpr):
    """The lane whose chunks hold ``slot``: the number of lanes whose chunks all come before it
    (chunk_at: [lanes + 1] offsets); ``lanes`` for a slot past the last chunk."""
    lane = 0
    for b in range(0, lanes, LANES_BLOCK):
        bs = b + tl.arange(0, LANES_BLOCK)
        ends = tl.load(chunk_at + 1 + bs, mask=bs < lanes, other=slot + 1)
        lane += tl.sum((ends <= slot).to(tl.int32), axis=0)
    return lane


# counts that vary call by call are not specialized on (1, multiples of 16): one variant meets them all
@triton.jit(do_not_specialize=["lanes", "rows_all"])
def _chunks(q, k, v, g, beta, cu_seqlens, starts, chunk_at, w, u, p, f, tri, scale, q_row, k_row, v_row,
            lanes, rows_all, KEY_HEADS: tl.constexpr, VALUE_HEADS: tl.constexpr, KEY_DIM: tl.constexpr,
            VALUE_DIM: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, PIECE: tl.constexpr,
            LANES_BLOCK: tl.constexpr, CHUNK: tl.constexpr, LOG_CHUNK: tl.constexpr, REFINED: tl.constexpr):
    """Role ``role`` of chunk slot ``slot`` for value head ``head``, as the module docstring lays out."""
    slot, head, role = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    lane = lane_of(chunk_at, slot, lanes, LANES_BLOCK)
    if lane >= lanes:
        return  # a slot past the last chunk: the grid is a bound, fixed without a host sync
    first = tl.load(cu_seqlens + lane)
    rows = tl.load(cu_seqlens + lane + 1) - first
    # the lane row at tile row 0
    base = (slot - tl.load(chunk_at + lane)) * CHUNK - tl.load(starts + lane) % CHUNK
    kh = k + head // (VALUE_HEADS // KEY_HEADS) * KEY_DIM
    t = tl.arange(0, CHUNK)
    i = base + t
    live = (i >= 0) & (i < rows)
    r = first + i
    at = r * VALUE_HEADS + head  # the rows' offsets into w, u, p, f and tri
    rk = _rnorm(kh, k_row, r, live, KEY_DIM, BLOCK_K, PIECE)
    total = tl.cumsum(tl.load(g + r * VALUE_HEADS + head, mask=live, other=0.0), axis=0)  # dead rows: g = 0
    if role == 1:
        qh = q + head // (VALUE_HEADS // KEY_HEADS) * KEY_DIM
        rq = _rnorm(qh, q_row, r, live, KEY_DIM, BLOCK_K, PIECE) * scale
        tl.debug_barrier()
        qk = _gram(qh, q_row, kh, k_row, r, live, KEY_DIM, BLOCK_K, PIECE)
        _store(p, at, CHUNK, live, t, t < CHUNK, rq[:, None] * qk * rk[None, :] * _decay(total, t, False))
        last = tl.minimum(rows - 1 - base, CHUNK - 1)  # tile row of the chunk's last row
        g_last = tl.sum(tl.where(t == last, total, 0.0), axis=0)
        tl.store(f + at, rq * tl.exp(total), mask=live)
        tl.store(f + rows_all * VALUE_HEADS + at, rk * tl.exp(g_last - total), mask=live)
        tl.store(f + 2 * rows_all * VALUE_HEADS + at, total, mask=live)
        return
    bt = tl.load(beta + r * VALUE_HEADS + head, mask=live, other=0.0)
    tl.debug_barrier()
    kk = _gram(kh, k_row, kh, k_row, r, live, KEY_DIM, BLOCK_K, PIECE)
    _store(tri, at, CHUNK, live, t, t < CHUNK, (bt * rk)[:, None] * kk * rk[None, :] * _decay(total, t, True))
    # Doubling from X = I: level 0 inverts the 2-row blocks (I - a'), level l > 0 those of 2^(l + 1)
    # rows. a's rows and columns outside the lane are zero, so the masked reads give it exactly, and
    # the barrier before each read orders the block's writes of tri before it.
    x = tl.where(t[:, None] == t[None, :], 1.0, 0.0)
    for level in tl.static_range(0, LOG_CHUNK):
        tl.debug_barrier()
        left = (t[:, None] >> level + 1 == t[None, :] >> level + 1) & \
            (t[:, None] >> level != t[None, :] >> level)
        off = tl.load(tri + at[:, None] * CHUNK + t[None, :], mask=live[:, None] & left, other=0.0)
        if level == 0:
            x = x - off
        elif REFINED:
            x = x - tl.dot(tl.dot(x, off, input_precision="tf32"), x, input_precision="tf32")
        else:
            x = x - dot(dot(x, off), x)
    if REFINED:  # one Newton step from the one-pass T: X + X (I - X - a X)
        x = _cut(x)
        tl.debug_barrier()
        a = tl.load(tri + at[:, None] * CHUNK + t[None, :], mask=live[:, None], other=0.0)
        residual = tl.where(t[:, None] == t[None, :], 1.0, 0.0) - x - _two_pass(a, x)
        x = x + tl.dot(x, residual, input_precision="tf32")
    ps = tl.arange(0, PIECE)
    grown = bt * tl.exp(total) * rk
    for n in tl.static_range(BLOCK_K // PIECE):
        tl.debug_barrier()
        y = _load(kh + n * PIECE, r, k_row, live, ps, n * PIECE + ps < KEY_DIM)
        w_piece = _scaled_dot(x, grown, y, k) if REFINED else dot(x, grown[:, None] * y)
        _store(w + n * PIECE, at, KEY_DIM, live, ps, n * PIECE + ps < KEY_DIM, w_piece)
    for n in tl.static_range(BLOCK_D // PIECE):
        tl.debug_barrier()
        y = _load(v + head * VALUE_DIM + n * PIECE, r, v_row, live, ps, n * PIECE + ps < VALUE_DIM)
        u_piece = _scaled_dot(x, bt, y, v) if REFINED else dot(x, bt[:, None] * y)
        _store(u + n * PIECE, at, VALUE_DIM, live, ps, n * PIECE + ps < VALUE_DIM, u_piece)

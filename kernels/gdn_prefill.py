"""Gated DeltaNet prefill on the state pool: the chunked delta rule over varlen lanes, states in place.

Lane b's rows are ``[cu_seqlens[b], cu_seqlens[b + 1])`` of q, k, v, g and beta, at absolute positions
from ``starts[b]``. Value head j reads key head j // (value_heads // key_heads); in fp32,
k <- k * rsqrt(sum(k^2) + 1e-6) and q <- scale * q * rsqrt(sum(q^2) + 1e-6). A lane's rows are cut
into chunks at multiples of ``CHUNK`` absolute positions (a lane starting off a multiple has a short
first chunk), and each chunk runs from the lane's state S [value_heads, key_dim, value_dim], fp32,
the UT transform of tfd.model.gdn.chunk::

    G = running sum of g;  D_ij = exp(G_i - G_j) for j <= i, else 0
    T = (I + strict_lower(beta K K^T o D))^-1;  W = T (beta e^G K);  U = T (beta V)
    V' = U - W S;  O = (e^G Q) S + (Q K^T o D) V';  S <- e^G_last S + (e^(G_last - G) K)^T V'

Two launches, or three for a lane or two (``FUSE_PROGRAMS``). Phase one (``_chunks``,
kernels/gdn_chunk.py) runs every chunk of every live lane at once, one program per (chunk slot, value
head, role), and writes all that does not depend on S:
W, U, P = Q K^T o D and three per-row factors, with a as scratch. Its grid is a bound on the chunks,
cdiv-free and fixed without a host sync: the lanes' chunk offsets are a cumsum on the device and
surplus slots return. Phase two (``_scan``) runs one program per (value block, value head, lane),
walking the lane's chunks in order with S [key_dim, BLOCK_V] in registers:

    keep S;  V' = U - W S;  S <- e^G_last S + K^T (f_k o V')

on the raw k rows (f_k = e^(G_last - G) |k|^-1 scales the product's rows), loading each step's
operands a key piece at a time so nothing spills, and forms the chunk's output rows from the S entering
it and V', both in its registers: O = f_q o (Q S) + P V' on the raw q rows (f_q = scale e^G |q|^-1).
Where the walk has too few programs to fill the device (``FUSE_PROGRAMS``: one lane), phase two keeps
each entering S and writes V' over U instead, and a third launch (``_output``) forms O for every chunk
at once, one program per (value block, value head, chunk slot), with the same bits: a shorter walk, S
and V' written and read back.

Memory: besides the new fp32 output, the kernels read the inputs and each live lane's state at
element offset ``state_at[b]`` of the pool's fp32 view, write that state back, and use fp32 scratch of
(key_dim + value_dim + 2 CHUNK + 3) values per row and value head (1.5 KB at the real dims, 406 MB
for 8192 rows of 32 heads), written by phase one and read by phase two; with phase three, one S
(key_dim x value_dim) per chunk and value head too (268 MB for 8192 rows of 32 heads), written by phase
two and read by phase three; nothing else. A lane whose offset is -1 is padding: it has no chunks,
none of the pool is read or written for it and its output rows are zeros. Products are fp32 by
``tl.dot`` at ``gdn_chunk.PRECISION`` (tf32x3), or with ``gdn_chunk.REFINED`` (the default) in fewer
passes to about the same accuracy (phase one's inverse refined, the products of raw 16-bit rows in two).

Exact across splits: every phase places lane row i at tile row (starts[b] + i) % CHUNK, so a chunk's
arithmetic depends only on its own rows and the state entering it, and every block shape follows the
head dims alone. A prefill split at a multiple of CHUNK therefore runs the same chunks on the same
states (stored to the pool and read back as fp32, exactly) and gives the same bits as one pass, and a
lane's bits never depend on the other lanes of the launch (they change which slot holds a chunk and
where its scratch rows lie, not what is computed).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import gdn_chunk
from tfd_kernels.gdn_chunk import dot, exact_left_dot

CHUNK = 64  # rows a chunk: tfd.model.GDN_CHUNK (the tests check), restated as kernels do not import tfd
# Value columns a phase-two program: 128 programs for one lane of 32 heads about fill an H200's 132
# SMs, and S is 32 registers a thread at 4 warps.
BLOCK_V = 32
NUM_WARPS = 4  # phase two: one warpgroup; ptxas spills at 8
# Phase two's loop pipelined two deep: its loads do not depend on S, so the next chunk's are in flight
# while this one multiplies (8192 rows of 32 heads: 3.01 ms with phase one against 3.19-3.50 unpipelined,
# the same bits; 16 or 64 columns, or 8 warps, were slower).
NUM_STAGES = 2
# Phase two forms each chunk's output rows as it walks (phase three's arithmetic on the values in its
# registers, the same bits) where its programs (value blocks x value heads x lanes) number at least this
# many: two an SM of an H100's or H200's 132, what the walk's 254 registers a thread let run at once.
# Then the S entering each chunk (268 MB for 8192 rows of 32 heads) and V' are never written and read back
# (H100, 8 x 1,024 rows of 32 heads, 1,024 programs: 1.165 ms a layer against 1.384). Fewer programs leave
# SMs idle through the walk, and phase three's own launch, every chunk at once, is the shorter way
# (Flash Next's one lane of 48 heads, 192 programs: 0.520 ms against 0.740 fused).
FUSE_PROGRAMS = 264


def fuses(value_dim: int, value_heads: int, lanes: int) -> bool:
    """Whether phase two forms the output itself (``FUSE_PROGRAMS``): by the walk's programs."""
    return triton.cdiv(value_dim, _blocks(1, value_dim)[1]) * value_heads * lanes >= FUSE_PROGRAMS


def _blocks(key_dim: int, value_dim: int) -> tuple[int, int]:
    # tl.dot wants every dimension at least 16
    return max(16, triton.next_power_of_2(key_dim)), max(16, min(BLOCK_V, triton.next_power_of_2(value_dim)))


@triton.jit
def _lane_tile(cu_seqlens, lane, block, VALUE_DIM: tl.constexpr, BLOCK_V: tl.constexpr, PIECE: tl.constexpr,
               CHUNK: tl.constexpr):
    """What phases two and three share of a program's place: the lane's first row and its rows, a
    chunk's tile rows, a piece's key dims, and the program's value columns with which are real."""
    first = tl.load(cu_seqlens + lane)
    vs = block * BLOCK_V + tl.arange(0, BLOCK_V)
    return (first, tl.load(cu_seqlens + lane + 1) - first, tl.arange(0, CHUNK), tl.arange(0, PIECE), vs,
            vs < VALUE_DIM)


# counts that vary call by call are not specialized on (1, multiples of 16): one variant meets them all
@triton.jit(do_not_specialize=["rows_all"])
def _scan(q, k, w, u, p, f, h, states, state_at, cu_seqlens, starts, chunk_at, out, q_row, k_row, rows_all,
          KEY_HEADS: tl.constexpr, VALUE_HEADS: tl.constexpr, KEY_DIM: tl.constexpr, VALUE_DIM: tl.constexpr,
          BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, PIECE: tl.constexpr, CHUNK: tl.constexpr,
          SPLIT: tl.constexpr, FUSED: tl.constexpr):
    """Phase two: value columns ``block`` of head ``head``'s S for lane ``lane``, through its chunks.
    ``FUSED``: each chunk's output rows too, O = f_q o (Q S) + P V' from the S entering it and its V',
    as phase three forms them; else keeps that S in ``h`` and V' in place of U, for phase three."""
    block, head, lane = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    key_head = head // (VALUE_HEADS // KEY_HEADS)
    first, rows, t, ps, vs, v_live = _lane_tile(cu_seqlens, lane, block, VALUE_DIM, BLOCK_V, PIECE, CHUNK)
    at = tl.load(state_at + lane)
    if at < 0:  # padding: no chunks, so phase three writes nothing; its rows are zeros
        outs = out + head * VALUE_DIM + vs[None, :]
        for c in range(0, tl.cdiv(rows, CHUNK)):
            i = c * CHUNK + t
            tl.store(outs + (first + i)[:, None] * (VALUE_HEADS * VALUE_DIM),
                     tl.zeros([CHUNK, BLOCK_V], tl.float32), mask=(i < rows)[:, None] & v_live[None, :])
        return
    tile = states + at + head * KEY_DIM * VALUE_DIM  # the lane's S for this head
    # S as [PIECE, BLOCK_V] pieces of key dims, so each product's register operand is a piece. (The
    # type ignores: mypy types s and step by their first value, the empty tuple.)
    s = ()
    for n in tl.static_range(BLOCK_K // PIECE):
        ks = n * PIECE + ps
        kept = (ks < KEY_DIM)[:, None] & v_live[None, :]
        s += (tl.load(tile + ks[:, None] * VALUE_DIM + vs[None, :], mask=kept, other=0.0),)  # type: ignore[assignment]
    lead = tl.load(starts + lane) % CHUNK  # tile rows before the lane's first row in its first chunk
    chunks = tl.where(rows > 0, tl.cdiv(rows + lead, CHUNK), 0)  # no rows: the state is left bit for bit
    slots = h + (tl.load(chunk_at + lane) * VALUE_HEADS + head) * KEY_DIM * VALUE_DIM
    for c in range(0, chunks):
        i = c * CHUNK - lead + t  # the lane row at each tile row, whatever row a launch began at
        live = (i >= 0) & (i < rows)
        r = first + i
        at_r = r * VALUE_HEADS + head  # the rows' offsets into phase one's w, u, p and f
        rv = live[:, None] & v_live[None, :]
        entering = slots + c * VALUE_HEADS * KEY_DIM * VALUE_DIM
        ws = tl.zeros([CHUNK, BLOCK_V], tl.float32)
        qs = tl.zeros([CHUNK, BLOCK_V], tl.float32)
        for n in tl.static_range(BLOCK_K // PIECE):
            ks = n * PIECE + ps
            if FUSED:
                qn = tl.load(q + r[:, None] * q_row + key_head * KEY_DIM + ks[None, :],
                             mask=live[:, None] & (ks < KEY_DIM)[None, :], other=0.0)
                qs = exact_left_dot(qn.to(tl.float32), s[n], qs, q, SPLIT)
            else:
                tl.store(entering + ks[:, None] * VALUE_DIM + vs[None, :], s[n],
                         mask=(ks < KEY_DIM)[:, None] & v_live[None, :])
            ws = dot(tl.load(w + at_r[:, None] * KEY_DIM + ks[None, :],
                             mask=live[:, None] & (ks < KEY_DIM)[None, :], other=0.0), s[n], ws)
        fresh = tl.load(u + at_r[:, None] * VALUE_DIM + vs[None, :], mask=rv, other=0.0) - ws
        if FUSED:  # phase three's arithmetic on the values it would read back
            qs *= tl.load(f + at_r, mask=live, other=0.0)[:, None]
            pc = tl.load(p + at_r[:, None] * CHUNK + t[None, :], mask=live[:, None], other=0.0)
            tl.store(out + r[:, None] * (VALUE_HEADS * VALUE_DIM) + head * VALUE_DIM + vs[None, :],
                     dot(pc, fresh, qs), mask=rv)
        else:
            # only this program reads it
            tl.store(u + at_r[:, None] * VALUE_DIM + vs[None, :], fresh, mask=rv)
        end = first + tl.minimum(rows - 1, c * CHUNK - lead + CHUNK - 1)  # the chunk's last row
        g_last = tl.exp(tl.load(f + (2 * rows_all + end) * VALUE_HEADS + head))
        fresh *= tl.load(f + rows_all * VALUE_HEADS + at_r, mask=live, other=0.0)[:, None]
        step = ()
        for n in tl.static_range(BLOCK_K // PIECE):
            ks = n * PIECE + ps
            kn = tl.load(k + r[None, :] * k_row + key_head * KEY_DIM + ks[:, None],
                         mask=(ks < KEY_DIM)[:, None] & live[None, :], other=0.0)
            step += (exact_left_dot(kn.to(tl.float32), fresh, s[n] * g_last, k, SPLIT),)  # type: ignore[assignment]
        s = step
    for n in tl.static_range(BLOCK_K // PIECE):
        ks = n * PIECE + ps
        kept = (ks < KEY_DIM)[:, None] & v_live[None, :]
        tl.store(tile + ks[:, None] * VALUE_DIM + vs[None, :], s[n], mask=kept)


# counts that vary call by call are not specialized on (1, multiples of 16): one variant meets them all
@triton.jit(do_not_specialize=["lanes"])
def _output(q, u, p, f, h, cu_seqlens, starts, chunk_at, out, q_row, lanes, KEY_HEADS: tl.constexpr,
            VALUE_HEADS: tl.constexpr, KEY_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_K: tl.constexpr,
            BLOCK_V: tl.constexpr, PIECE: tl.constexpr, CHUNK: tl.constexpr,
            LANES_BLOCK: tl.constexpr, SPLIT: tl.constexpr):
    """Phase three: chunk slot ``slot``'s output rows for value columns ``block`` of head ``head``,
    O = f_q o (Q S) + P V', from the S that entered the chunk and its V' (phase two's)."""
    block, head, slot = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    lane = gdn_chunk.lane_of(chunk_at, slot, lanes, LANES_BLOCK)
    if lane >= lanes:
        return  # a slot past the last chunk
    first, rows, t, ps, vs, v_live = _lane_tile(cu_seqlens, lane, block, VALUE_DIM, BLOCK_V, PIECE, CHUNK)
    i = (slot - tl.load(chunk_at + lane)) * CHUNK - tl.load(starts + lane) % CHUNK + t
    live = (i >= 0) & (i < rows)
    r = first + i
    at_r = r * VALUE_HEADS + head
    rv = live[:, None] & v_live[None, :]
    entering = h + (slot * VALUE_HEADS + head) * KEY_DIM * VALUE_DIM
    key_head = head // (VALUE_HEADS // KEY_HEADS)
    qs = tl.zeros([CHUNK, BLOCK_V], tl.float32)
    for n in tl.static_range(BLOCK_K // PIECE):
        ks = n * PIECE + ps
        qn = tl.load(q + r[:, None] * q_row + key_head * KEY_DIM + ks[None, :],
                     mask=live[:, None] & (ks < KEY_DIM)[None, :], other=0.0)
        sn = tl.load(entering + ks[:, None] * VALUE_DIM + vs[None, :],
                     mask=(ks < KEY_DIM)[:, None] & v_live[None, :], other=0.0)
        qs = exact_left_dot(qn.to(tl.float32), sn, qs, q, SPLIT)
    qs *= tl.load(f + at_r, mask=live, other=0.0)[:, None]
    pc = tl.load(p + at_r[:, None] * CHUNK + t[None, :], mask=live[:, None], other=0.0)
    fresh = tl.load(u + at_r[:, None] * VALUE_DIM + vs[None, :], mask=rv, other=0.0)
    outs = out + r[:, None] * (VALUE_HEADS * VALUE_DIM) + head * VALUE_DIM + vs[None, :]
    tl.store(outs, dot(pc, fresh, qs), mask=rv)


def _check(name: str, t: torch.Tensor, shape: tuple[int, ...], *dtypes: torch.dtype) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} is {list(t.shape)}, expected {list(shape)}")
    if dtypes and t.dtype not in dtypes:
        raise ValueError(f"{name} is {t.dtype}, expected {' or '.join(map(str, dtypes))}")
    if t.dim() == 1 and not t.is_contiguous():  # offsets are read as consecutive elements
        raise ValueError(f"{name} must be contiguous, its stride is {t.stride()}")


def _rows(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``t`` with contiguous heads, and its row stride: q, k and v are read in place as conv output views."""
    if t.stride(-1) != 1 or t.stride(-2) != t.shape[-1]:
        t = t.contiguous()
    return t, t.stride(0)


def prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
            states: torch.Tensor, state_at: torch.Tensor, cu_seqlens: torch.Tensor, starts: torch.Tensor,
            scale: float, max_rows: int) -> torch.Tensor:
    """The chunked delta rule over the lanes' rows: q, k [rows, key_heads, key_dim] and v [rows,
    value_heads, value_dim] in the model dtype, g and beta [rows, value_heads] fp32; lane b's rows are
    ``cu_seqlens[b]`` (int32, [lanes + 1], its last entry ``rows``) up to the next, at positions from
    ``starts[b]``. Each lane's state is updated in place; out fp32 like v. ``max_rows`` bounds every
    lane's count: the grids are fixed without it (phase one's by the rows and lanes, phase two's
    programs loop over their lane's chunks), so it only skips empty launches; it is the argument
    conv1d.prefill takes, read without a host sync."""
    if q.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q and v need 3 axes, got {q.dim()} and {v.dim()}")
    if not q.dtype.is_floating_point:
        raise ValueError(f"q is {q.dtype}, expected a float dtype")
    rows, key_heads, key_dim = q.shape
    value_heads, value_dim = v.shape[1:]
    if value_heads % key_heads:
        raise ValueError(f"v has {value_heads} heads, not a multiple of q's {key_heads}")
    _check("k", k, tuple(q.shape), q.dtype)
    _check("v", v, (rows, value_heads, value_dim), q.dtype)
    _check("g", g, (rows, value_heads), torch.float32)
    _check("beta", beta, (rows, value_heads), torch.float32)
    if states.dim() != 1 or states.dtype != torch.float32:
        raise ValueError(f"states must be the pool's 1-D float32 view, got {states.dtype} {states.dim()}-D")
    lanes = state_at.shape[0] if state_at.dim() == 1 else -1
    _check("state_at", state_at, (lanes,), torch.int64)
    _check("cu_seqlens", cu_seqlens, (lanes + 1,), torch.int32)
    _check("starts", starts, (lanes,), torch.int32, torch.int64)
    if max_rows < 0:
        raise ValueError(f"max_rows is {max_rows}, expected at least 0")
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    if lanes == 0 or max_rows == 0:
        return out
    block_k, block_v = _blocks(key_dim, value_dim)
    block_d = max(16, triton.next_power_of_2(value_dim))
    (q, q_row), (k, k_row), (v, v_row) = (_rows(x) for x in (q, k, v))
    g, beta = g.contiguous(), beta.contiguous()
    # Each live lane's chunk count, on the device: slot chunk_at[b] + c holds lane b's chunk c.
    counts = cu_seqlens[1:] - cu_seqlens[:-1]
    chunks = torch.where((counts > 0) & (state_at >= 0), (counts + starts % CHUNK + CHUNK - 1) // CHUNK, 0)
    chunk_at = torch.zeros(lanes + 1, dtype=torch.int32, device=q.device)
    torch.cumsum(chunks, 0, dtype=torch.int32, out=chunk_at[1:])
    # A lane of n >= 1 rows has at most n chunks and at most n // CHUNK + 2 (all but its first and last
    # are full), so this many slots hold every chunk. (cdiv(rows, CHUNK) + lanes would not: a lane of 2
    # rows across a multiple of CHUNK is 2 chunks.)
    slots = min(rows, rows // CHUNK + 2 * lanes)
    w, u, p, tri = (torch.empty(rows, value_heads, width, dtype=torch.float32, device=q.device)
                    for width in (key_dim, value_dim, CHUNK, CHUNK))
    f = torch.empty(3, rows, value_heads, dtype=torch.float32, device=q.device)
    if slots:
        gdn_chunk._chunks[(slots, value_heads, 2)](
            q, k, v, g, beta, cu_seqlens, starts, chunk_at, w, u, p, f, tri, scale, q_row, k_row, v_row,
            lanes, rows, KEY_HEADS=key_heads, VALUE_HEADS=value_heads, KEY_DIM=key_dim, VALUE_DIM=value_dim,
            BLOCK_K=block_k, BLOCK_D=block_d, PIECE=min(gdn_chunk.PIECE, block_k, block_d),
            LANES_BLOCK=gdn_chunk.LANES_BLOCK, CHUNK=CHUNK, LOG_CHUNK=CHUNK.bit_length() - 1,
            REFINED=gdn_chunk.REFINED, num_warps=gdn_chunk.NUM_WARPS)
    fused = fuses(value_dim, value_heads, lanes)
    # the S entering each chunk, for phase three: none where phase two forms the output itself
    h = torch.empty(0 if fused else slots, value_heads, key_dim, value_dim, dtype=torch.float32,
                    device=q.device)
    _scan[(triton.cdiv(value_dim, block_v), value_heads, lanes)](
        q, k, w, u, p, f, h, states, state_at, cu_seqlens, starts, chunk_at, out, q_row, k_row, rows,
        KEY_HEADS=key_heads, VALUE_HEADS=value_heads, KEY_DIM=key_dim, VALUE_DIM=value_dim, BLOCK_K=block_k,
        BLOCK_V=block_v, PIECE=min(gdn_chunk.PIECE, block_k), CHUNK=CHUNK, SPLIT=gdn_chunk.REFINED,
        FUSED=fused, num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    if slots and not fused:
        _output[(triton.cdiv(value_dim, block_v), value_heads, slots)](
            q, u, p, f, h, cu_seqlens, starts, chunk_at, out, q_row, lanes, KEY_HEADS=key_heads,
            VALUE_HEADS=value_heads, KEY_DIM=key_dim, VALUE_DIM=value_dim, BLOCK_K=block_k, BLOCK_V=block_v,
            PIECE=min(gdn_chunk.PIECE, block_k), CHUNK=CHUNK, LANES_BLOCK=gdn_chunk.LANES_BLOCK,
            SPLIT=gdn_chunk.REFINED, num_warps=NUM_WARPS)
    return out


def reference_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of n rows ([n, heads, dim], g and beta [n, heads]) from state ``s``, as in the module
    docstring with U = T beta V and W = T beta e^G K formed. The model's span path (tfd.model.gdn)
    runs its prompt chunks through this too."""
    q, k, v = (x.transpose(0, 1) for x in (q, k, v))
    g, beta = g.transpose(0, 1), beta.transpose(0, 1)
    n = q.shape[1]
    total = g.cumsum(dim=1)
    lower = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    decay = (total[:, :, None] - total[:, None, :]).masked_fill(~lower, float("-inf")).exp()
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    system = (k_beta @ k.transpose(1, 2)) * decay  # its unit diagonal is taken as read by the solves
    u = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * total.exp()[..., None], upper=False,
                                      unitriangular=True)
    fresh = u - w @ s
    out = (q * total.exp()[..., None]) @ s + ((q @ k.transpose(1, 2)) * decay) @ fresh
    last = total[:, -1:]
    s = s * last.exp()[..., None] + (k * (last - total).exp()[..., None]).transpose(1, 2) @ fresh
    return out.transpose(0, 1), s


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              states: torch.Tensor, state_at: torch.Tensor, cu_seqlens: torch.Tensor, starts: torch.Tensor,
              scale: float, max_rows: int) -> torch.Tensor:
    """``prefill`` in torch, a lane and a chunk at a time (``max_rows`` is not needed here)."""
    del max_rows
    ratio = v.shape[1] // q.shape[1]
    shape = (v.shape[1], q.shape[2], v.shape[2])
    size = shape[0] * shape[1] * shape[2]

    def normed(x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        return (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)).repeat_interleave(ratio, dim=1)

    out = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    bounds = cu_seqlens.tolist()
    for lane, (at, start) in enumerate(zip(state_at.tolist(), starts.tolist(), strict=True)):
        if at < 0:
            continue
        a, b = bounds[lane], bounds[lane + 1]
        lane_q, lane_k, lane_v = normed(q[a:b]) * scale, normed(k[a:b]), v[a:b].float()
        state = states[at:at + size].view(shape)
        s, row = state.clone(), 0
        while row < b - a:
            end = min(b - a, row + CHUNK - (start + row) % CHUNK)
            piece = slice(row, end)
            out[a + row:a + end], s = reference_chunk(lane_q[piece], lane_k[piece], lane_v[piece],
                                                       g[a + row:a + end], beta[a + row:a + end], s)
            row = end
        state.copy_(s)
    return out

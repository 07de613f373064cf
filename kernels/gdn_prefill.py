"""Gated DeltaNet prefill on the state pool: the chunked delta rule over varlen lanes, states in place.

Lane b's rows are ``[cu_seqlens[b], cu_seqlens[b + 1])`` of q, k, v, g and beta, at absolute positions
from ``starts[b]``. Value head j reads key head j // (value_heads // key_heads); in fp32,
k <- k * rsqrt(sum(k^2) + 1e-6) and q <- scale * q * rsqrt(sum(q^2) + 1e-6). A lane's rows are cut
into chunks at multiples of ``CHUNK`` absolute positions (a lane starting off a multiple has a short
first chunk), and each chunk runs from the lane's state S [value_heads, key_dim, value_dim], fp32,
the UT transform of tfd.model.gdn.chunk::

    G = running sum of g;  D_ij = exp(G_i - G_j) for j <= i, else 0
    T = (I + strict_lower(beta K K^T o D))^-1;  V' = T (beta (V - e^G K S))
    O = (e^G Q) S + (Q K^T o D) V';  S <- e^G_last S + (e^(G_last - G) K)^T V'

(V' is U - W S with U = T beta V and W = T beta e^G K, regrouped so W is never formed.)

Memory: besides the new fp32 output, the kernel reads the inputs and each live lane's state at element
offset ``state_at[b]`` of the pool's fp32 view and writes that state back; nothing else. A lane whose
offset is -1 is padding: none of the pool is read or written for it and its output rows are zeros.

Exact across splits: one program per (value block, value head, lane) walks its lane's chunks in order
with S in registers. A chunk's tile holds lane row i at tile row (starts[b] + i) % CHUNK, so a chunk's
arithmetic depends only on its own rows and the state entering it, and block shapes follow the head
dims alone. A prefill split at a multiple of CHUNK therefore runs the same chunks on the same states
(stored to the pool and read back as fp32, exactly) and gives the same bits as one pass, and a lane's
bits never depend on the other lanes of the launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 64  # rows a chunk: tfd.model.GDN_CHUNK (the tests check), restated as kernels do not import tfd
# Value columns a program and its warps, not measured yet: more programs for long single lanes and a
# 16 KiB state tile at 128 key dims, at the cost of redoing the chunk's T for each value block.
BLOCK_V = 32
NUM_WARPS = 4


def _blocks(key_dim: int, value_dim: int) -> tuple[int, int]:
    # tl.dot wants every dimension at least 16
    return max(16, triton.next_power_of_2(key_dim)), max(16, min(BLOCK_V, triton.next_power_of_2(value_dim)))


@triton.jit
def _dot(a, b):
    # fp32 operands stay fp32 (no tf32), so the kernel meets the fp32 reference closely
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _normed(rows, live, ks, k_live):
    """The rows at pointers ``rows`` [CHUNK] as fp32, each scaled to unit length (dead rows zero)."""
    x = tl.load(rows[:, None] + ks[None, :], mask=live[:, None] & k_live[None, :], other=0.0).to(tl.float32)
    return x * tl.rsqrt(tl.sum(x * x, axis=1) + 1e-6)[:, None]


@triton.jit
def _inverse(a, CHUNK: tl.constexpr):
    """(I + a)^-1 for a strictly lower triangular [CHUNK, CHUNK], by forward substitution a row at a time."""
    t = tl.arange(0, CHUNK)
    x = -a  # rows above r already hold the inverse's rows less I; row r still holds -a_r
    for r in range(1, CHUNK):
        at_r = t[:, None] == r
        row = tl.sum(tl.where(at_r, x, 0.0), axis=0)
        row += tl.sum(row[:, None] * x, axis=0)  # row is zero from column r on, so only done rows count
        x = tl.where(at_r, row[None, :], x)
    return x + tl.where(t[:, None] == t[None, :], 1.0, 0.0)


@triton.jit
def _prefill(q, k, v, g, beta, states, state_at, cu_seqlens, starts, out, scale, q_row, k_row, v_row,
             KEY_HEADS: tl.constexpr, VALUE_HEADS: tl.constexpr, KEY_DIM: tl.constexpr,
             VALUE_DIM: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, CHUNK: tl.constexpr):
    block, head, lane = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    key_head = head // (VALUE_HEADS // KEY_HEADS)
    first = tl.load(cu_seqlens + lane)
    rows = tl.load(cu_seqlens + lane + 1) - first
    t = tl.arange(0, CHUNK)
    ks = tl.arange(0, BLOCK_K)
    vs = block * BLOCK_V + tl.arange(0, BLOCK_V)
    k_live, v_live = ks < KEY_DIM, vs < VALUE_DIM
    outs = out + head * VALUE_DIM + vs[None, :]
    at = tl.load(state_at + lane)
    if at < 0:
        for c in range(0, tl.cdiv(rows, CHUNK)):
            i = c * CHUNK + t
            tl.store(outs + (first + i)[:, None] * (VALUE_HEADS * VALUE_DIM),
                     tl.zeros([CHUNK, BLOCK_V], tl.float32), mask=(i < rows)[:, None] & v_live[None, :])
        return
    tile = head * KEY_DIM * VALUE_DIM + ks[:, None] * VALUE_DIM + vs[None, :]
    tile_live = k_live[:, None] & v_live[None, :]
    s = tl.load(states + at + tile, mask=tile_live, other=0.0)
    lead = tl.load(starts + lane) % CHUNK  # tile rows before the lane's first row in its first chunk
    lower = t[:, None] >= t[None, :]
    chunks = tl.where(rows > 0, tl.cdiv(rows + lead, CHUNK), 0)  # no rows: the state is left bit for bit
    for c in range(0, chunks):
        i = c * CHUNK - lead + t  # the lane row at each tile row, whatever row a launch began at
        live = (i >= 0) & (i < rows)
        r = first + i
        kn = _normed(k + r * k_row + key_head * KEY_DIM, live, ks, k_live)
        vr = tl.load(v + r[:, None] * v_row + head * VALUE_DIM + vs[None, :],
                     mask=live[:, None] & v_live[None, :], other=0.0).to(tl.float32)
        br = tl.load(beta + r * VALUE_HEADS + head, mask=live, other=0.0)
        total = tl.cumsum(tl.load(g + r * VALUE_HEADS + head, mask=live, other=0.0), axis=0)
        # exp of -inf above the diagonal: no overflow from G_i - G_j > 0 there
        decay = tl.exp(tl.where(lower, total[:, None] - total[None, :], float("-inf")))
        system = tl.where(t[:, None] > t[None, :], _dot(kn, tl.trans(kn)) * decay * br[:, None], 0.0)
        grown = tl.exp(total)
        fresh = _dot(_inverse(system, CHUNK), br[:, None] * (vr - _dot(kn * grown[:, None], s)))
        qn = _normed(q + r * q_row + key_head * KEY_DIM, live, ks, k_live) * scale
        o = _dot(qn * grown[:, None], s) + _dot(_dot(qn, tl.trans(kn)) * decay, fresh)
        tl.store(outs + r[:, None] * (VALUE_HEADS * VALUE_DIM), o, mask=live[:, None] & v_live[None, :])
        last = tl.sum(tl.where(t == CHUNK - 1, total, 0.0), axis=0)  # dead rows past the end add g = 0
        s = s * tl.exp(last) + _dot(tl.trans(kn * tl.exp(last - total)[:, None]), fresh)
    tl.store(states + at + tile, s, mask=tile_live)


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
    lane's count: the grid is fixed without it (a program loops over its lane's chunks), so it only
    skips an empty launch; it is the argument conv1d.prefill takes, read without a host sync."""
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
    (q, q_row), (k, k_row), (v, v_row) = (_rows(x) for x in (q, k, v))
    grid = (triton.cdiv(value_dim, block_v), value_heads, lanes)
    _prefill[grid](q, k, v, g.contiguous(), beta.contiguous(), states, state_at, cu_seqlens, starts, out,
                   scale, q_row, k_row, v_row, KEY_HEADS=key_heads, VALUE_HEADS=value_heads,
                   KEY_DIM=key_dim, VALUE_DIM=value_dim, BLOCK_K=block_k, BLOCK_V=block_v, CHUNK=CHUNK,
                   num_warps=NUM_WARPS)
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

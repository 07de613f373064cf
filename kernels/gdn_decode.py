"""Gated DeltaNet decode on the state pool: the delta rule a row at a time, states updated in place.

For each lane and value head j, reading key head j // (value_heads // key_heads), a row computes
in fp32::

    k <- k * rsqrt(sum(k^2) + 1e-6);  q <- scale * q * rsqrt(sum(q^2) + 1e-6)
    S <- e^g S;  S <- S + k (beta (v - S^T k))^T;  o = S^T q

where S is the lane's state [value_heads, key_dim, value_dim], fp32, at an element offset into the
pool's fp32 view. ``decode`` runs one row per lane and writes S back where it was read. ``verify``
runs several rows from the state at ``state_at``, only reads that state, writes the state after the
last row to ``spare_at`` and logs each row's normalised k, v, g and beta (fp32 rows of
``key_heads * key_dim + value_heads * value_dim + 2 * value_heads``) at ``log_at``. ``replay``
applies a lane's first ``kept`` logged rows to the state at ``from_at`` and writes ``to_at``. All
three update S through the one helper ``_step``, so the same rows give the same bits by any path.
Their torch forms are ``tfd_kernels.gdn_reference``'s.

Besides the new output, memory written is only those states and log pieces. A lane whose state
offset (``state_at``, or ``from_at`` for replay) is -1 is padding: none of the pool is read or
written for it and its output rows are zeros. Programs run over (value block, value head, lane)
with key_dim whole in registers; the block shape depends on the head dims alone, never on the
number of lanes, so a lane's bits do not depend on its batch.
"""

from __future__ import annotations

import attrs
import torch
import triton
import triton.language as tl

from tfd_kernels import gdn_gates, pdl

# Value columns per program and warps: measured best of 8/16/32/64 x 1..8 on the H200 at 16 to 96 lanes
# (about 3.3 TB/s of state read plus written). The same for every path: the reductions' order follows them.
BLOCK_V = 16
NUM_WARPS = 4
# A row's loads (k, q, v, the gates' inputs) all asked for before the norms' reductions: a load after a
# reduction waits for it, so each read was a round trip of its own; the same bits.
# H200, 35B-A3B one stream, tfd bench --variant, best of three (2026-12-02):
# 2.4314 ms against 2.4381; 9B one stream 4.4901 against 4.4987, 32 streams 6.6503 against 6.7441.
LOADS_FIRST = True


def _blocks(key_dim: int, value_dim: int) -> tuple[int, int]:
    return triton.next_power_of_2(key_dim), min(BLOCK_V, triton.next_power_of_2(value_dim))


@triton.jit
def _unit(x):
    """A loaded q or k row scaled to unit length (the l2norm with its 1e-6), in fp32."""
    x = x.to(tl.float32)
    return x * tl.rsqrt(tl.sum(x * x, axis=0) + 1e-6)


@triton.jit
def _normed(ptr, ks, k_live):
    return _unit(tl.load(ptr + ks, mask=k_live, other=0.0))


@triton.jit
def _step(s, k, v, g, beta):
    # The one update every path runs; an explicit fma so no compiler choice can differ between them.
    s = s * tl.exp(g)
    read = tl.sum(s * k[:, None], axis=0)
    delta = beta * (v - read)
    return tl.fma(k[:, None], delta[None, :], s)


@triton.jit
def _rows(q, k, v, g, beta, states, state_at, write_at, log, log_at, out, rows, scale,
          q_lane, q_row, k_lane, k_row, v_lane, v_row, a_log, dt_bias, g_lane, g_row, beta_lane, beta_row,
          threshold, KEY_HEADS: tl.constexpr, VALUE_HEADS: tl.constexpr, KEY_DIM: tl.constexpr,
          VALUE_DIM: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, LOG: tl.constexpr,
          GATED: tl.constexpr, LOADS_FIRST: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    block, head, lane = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    key_head = head // (VALUE_HEADS // KEY_HEADS)
    ks = tl.arange(0, BLOCK_K)
    vs = block * BLOCK_V + tl.arange(0, BLOCK_V)
    k_live, v_live = ks < KEY_DIM, vs < VALUE_DIM
    outs = out + (lane * rows * VALUE_HEADS + head) * VALUE_DIM + vs
    at = tl.load(state_at + lane)
    if at < 0:
        for r in range(rows):
            tl.store(outs + r * VALUE_HEADS * VALUE_DIM, tl.zeros([BLOCK_V], tl.float32), mask=v_live)
        return
    tile = head * KEY_DIM * VALUE_DIM + ks[:, None] * VALUE_DIM + vs[None, :]
    tile_live = k_live[:, None] & v_live[None, :]
    s = tl.load(states + at + tile, mask=tile_live, other=0.0)
    written = tl.load(write_at + lane) if LOADS_FIRST else 0  # where the state goes, asked for now too
    for r in range(rows):
        k_at = k + lane * k_lane + r * k_row + key_head * KEY_DIM
        q_at = q + lane * q_lane + r * q_row + key_head * KEY_DIM
        if LOADS_FIRST:  # every load of the row in flight at once, before the norms' reductions
            k_loaded = tl.load(k_at + ks, mask=k_live, other=0.0)
            q_loaded = tl.load(q_at + ks, mask=k_live, other=0.0)
        else:
            kn = _normed(k_at, ks, k_live)
            qn = _normed(q_at, ks, k_live) * scale
        vr = tl.load(v + lane * v_lane + r * v_row + head * VALUE_DIM + vs, mask=v_live, other=0.0)
        raw_b = tl.load(beta + lane * beta_lane + r * beta_row + head)
        raw_g = tl.load(g + lane * g_lane + r * g_row + head)
        if GATED:
            head_a_log, head_dt_bias = tl.load(a_log + head), tl.load(dt_bias + head)
        if LOADS_FIRST:
            kn = _unit(k_loaded)
            qn = _unit(q_loaded) * scale
        vr = vr.to(tl.float32)
        if GATED:  # g holds the projection's a and beta its b: the gates formed here, as gdn_gates does
            br, gr = gdn_gates.gate_values(raw_b, raw_g, head_a_log, head_dt_bias, threshold)
        else:
            gr, br = raw_g, raw_b
        s = _step(s, kn, vr, gr, br)
        tl.store(outs + r * VALUE_HEADS * VALUE_DIM, tl.sum(s * qn[:, None], axis=0), mask=v_live)
        if LOG:
            entry = log + tl.load(log_at + lane) + r * (KEY_HEADS * KEY_DIM + VALUE_HEADS * VALUE_DIM
                                                        + 2 * VALUE_HEADS)
            tl.store(entry + KEY_HEADS * KEY_DIM + head * VALUE_DIM + vs, vr, mask=v_live)
            if block == 0:  # one program a head logs its g and beta
                gates = entry + KEY_HEADS * KEY_DIM + VALUE_HEADS * VALUE_DIM
                tl.store(gates + head, gr)
                tl.store(gates + VALUE_HEADS + head, br)
                if head % (VALUE_HEADS // KEY_HEADS) == 0:  # and the first head reading a key head, its k
                    tl.store(entry + key_head * KEY_DIM + ks, kn, mask=k_live)
    if not LOADS_FIRST:
        written = tl.load(write_at + lane)
    tl.store(states + written + tile, s, mask=tile_live)


@triton.jit
def _replay(log, log_at, states, from_at, to_at, kept, lanes,
            KEY_HEADS: tl.constexpr, VALUE_HEADS: tl.constexpr, KEY_DIM: tl.constexpr,
            VALUE_DIM: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    block, head, pair = tl.program_id(0), tl.program_id(1), tl.program_id(2)  # pair: layer * lanes + lane
    key_head = head // (VALUE_HEADS // KEY_HEADS)
    ks = tl.arange(0, BLOCK_K)
    vs = block * BLOCK_V + tl.arange(0, BLOCK_V)
    k_live, v_live = ks < KEY_DIM, vs < VALUE_DIM
    at = tl.load(from_at + pair)
    if at < 0:
        return
    tile = head * KEY_DIM * VALUE_DIM + ks[:, None] * VALUE_DIM + vs[None, :]
    tile_live = k_live[:, None] & v_live[None, :]
    s = tl.load(states + at + tile, mask=tile_live, other=0.0)
    base = log + tl.load(log_at + pair)
    for r in range(tl.load(kept + pair % lanes)):
        entry = base + r * (KEY_HEADS * KEY_DIM + VALUE_HEADS * VALUE_DIM + 2 * VALUE_HEADS)
        kn = tl.load(entry + key_head * KEY_DIM + ks, mask=k_live, other=0.0)
        entry += KEY_HEADS * KEY_DIM
        vr = tl.load(entry + head * VALUE_DIM + vs, mask=v_live, other=0.0)
        entry += VALUE_HEADS * VALUE_DIM
        s = _step(s, kn, vr, tl.load(entry + head), tl.load(entry + VALUE_HEADS + head))
    tl.store(states + tl.load(to_at + pair) + tile, s, mask=tile_live)


def _check(name: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} is {list(t.shape)}, expected {list(shape)}")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name} is {t.dtype}, expected {dtype}")
    if t.dim() == 1 and not t.is_contiguous():  # offsets are read as consecutive elements
        raise ValueError(f"{name} must be contiguous, its stride is {t.stride()}")


def _check_view(name: str, view: torch.Tensor) -> None:
    if view.dim() != 1 or view.dtype != torch.float32:
        raise ValueError(f"{name} must be the pool's 1-D float32 view, got {view.dtype} {view.dim()}-D")


def _check_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None,
                beta: torch.Tensor | None, states: torch.Tensor, lead: int) -> tuple[int, int, int, int]:
    """Shapes shared by decode and verify, ``lead`` the axes before the heads (g and beta when
    given); the head dims."""
    if q.dim() != lead + 2 or v.dim() != lead + 2:
        raise ValueError(f"q and v need {lead + 2} axes, got {q.dim()} and {v.dim()}")
    key_heads, key_dim = q.shape[lead:]
    value_heads, value_dim = v.shape[lead:]
    if value_heads % key_heads:
        raise ValueError(f"v has {value_heads} heads, not a multiple of q's {key_heads}")
    _check("k", k, tuple(q.shape), q.dtype)
    _check("v", v, (*q.shape[:lead], value_heads, value_dim), q.dtype)
    for name, gate in (("g", g), ("beta", beta)):
        if gate is not None:
            _check(name, gate, (*q.shape[:lead], value_heads), torch.float32)
    _check_view("states", states)
    return key_heads, value_heads, key_dim, value_dim


def _heads(t: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """``t`` with contiguous heads, and its lane and row strides: the kernels read q, k and v in place
    as views of the conv output."""
    if t.stride(-1) != 1 or t.stride(-2) != t.shape[-1]:
        t = t.contiguous()
    return t, t.stride(0), t.stride(1) if t.dim() == 4 else 0


@attrs.frozen
class Gates:
    """A GDN layer's gates for the rule: ``g`` and ``beta`` (fp32) formed already, or, ``raw``, the
    projection's ``a`` and ``b`` (model dtype, views) with the heads' ``a_log`` and ``dt_bias``,
    from which the kernel forms them itself (``tfd_kernels.gdn_gates``' arithmetic, the same bits)."""

    g: torch.Tensor  # [lanes(, rows), value_heads]: g, or a when raw
    beta: torch.Tensor  # beta, or b when raw
    a_log: torch.Tensor | None = None
    dt_bias: torch.Tensor | None = None

    @property
    def raw(self) -> bool:
        return self.a_log is not None


def _heads_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _strides(t: torch.Tensor) -> tuple[int, int]:
    """A [lanes(, rows), heads] gate tensor's lane and row strides; its heads must be contiguous."""
    if t.stride(-1) != 1:
        raise ValueError(f"gates must have contiguous heads, their strides are {t.stride()}")
    return t.stride(0), t.stride(1) if t.dim() == 3 else 0


def _launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gates: Gates,
            states: torch.Tensor, state_at: torch.Tensor, write_at: torch.Tensor, log: torch.Tensor,
            log_at: torch.Tensor, out: torch.Tensor, rows: int, scale: float, logging: bool) -> None:
    lanes = q.shape[0]
    key_heads, key_dim = q.shape[-2:]
    value_heads, value_dim = v.shape[-2:]
    for name, at in (("state_at", state_at), ("write_at", write_at), ("log_at", log_at)):
        _check(name, at, (lanes,), torch.int64)
    block_k, block_v = _blocks(key_dim, value_dim)
    grid = (triton.cdiv(value_dim, block_v), value_heads, lanes)
    (q, *q_strides), (k, *k_strides), (v, *v_strides) = (_heads(t) for t in (q, k, v))
    a_log = gates.a_log if gates.a_log is not None else gates.g  # not read unless raw
    dt_bias = gates.dt_bias if gates.dt_bias is not None else gates.g
    _rows[grid](q, k, v, gates.g, gates.beta, states, state_at, write_at, log, log_at, out,
                rows, scale, *q_strides, *k_strides, *v_strides, a_log, dt_bias, *_strides(gates.g),
                *_strides(gates.beta), gdn_gates.SOFTPLUS_THRESHOLD, KEY_HEADS=key_heads,
                VALUE_HEADS=value_heads, KEY_DIM=key_dim, VALUE_DIM=value_dim, BLOCK_K=block_k,
                BLOCK_V=block_v, LOG=logging, GATED=gates.raw, LOADS_FIRST=LOADS_FIRST, num_warps=NUM_WARPS,
                **pdl.options(q.device))


def decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
           states: torch.Tensor, state_at: torch.Tensor, scale: float) -> torch.Tensor:
    """One row per lane: q, k [lanes, key_heads, key_dim], v [lanes, value_heads, value_dim], g and
    beta [lanes, value_heads] fp32; each lane's state is updated in place; out fp32 like v."""
    _check_rows(q, k, v, g, beta, states, lead=1)
    return _decode(q, k, v, Gates(_heads_contiguous(g), _heads_contiguous(beta)), states, state_at, scale)


def decode_gated(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                 a_log: torch.Tensor, dt_bias: torch.Tensor, states: torch.Tensor, state_at: torch.Tensor,
                 scale: float) -> torch.Tensor:
    """``decode`` with the gates formed in the kernel from the projection's ``b`` and ``a`` [lanes,
    value_heads] (model dtype, any lane stride) and the heads' ``a_log`` and ``dt_bias``: the same
    bits as ``decode`` given ``tfd_kernels.gdn_gates.gates(b, a, a_log, dt_bias)``, one launch less."""
    _, value_heads, _, _ = _check_rows(q, k, v, None, None, states, lead=1)
    for name, t in (("b", b), ("a", a)):
        _check(name, t, (q.shape[0], value_heads), q.dtype)
    for name, t in (("a_log", a_log), ("dt_bias", dt_bias)):
        _check(name, t, (value_heads,))
    return _decode(q, k, v, Gates(a, b, a_log, dt_bias), states, state_at, scale)


def _decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gates: Gates, states: torch.Tensor,
            state_at: torch.Tensor, scale: float) -> torch.Tensor:
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    _launch(q, k, v, gates, states, state_at, state_at, states, state_at, out, 1, scale, logging=False)
    return out


def verify(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
           states: torch.Tensor, state_at: torch.Tensor, spare_at: torch.Tensor, log: torch.Tensor,
           log_at: torch.Tensor, scale: float) -> torch.Tensor:
    """``rows`` rows per lane (inputs [lanes, rows, ...]) from the state at ``state_at``, left as it
    was; the state after the last row goes to ``spare_at``, each row's k, v, g, beta to the log."""
    _check_rows(q, k, v, g, beta, states, lead=2)
    _check_view("log", log)
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    _launch(q, k, v, Gates(g.contiguous(), beta.contiguous()), states, state_at, spare_at, log, log_at, out,
            q.shape[1], scale, logging=True)
    return out


def verify_gated(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                 a_log: torch.Tensor, dt_bias: torch.Tensor, states: torch.Tensor, state_at: torch.Tensor,
                 spare_at: torch.Tensor, log: torch.Tensor, log_at: torch.Tensor, scale: float
                 ) -> torch.Tensor:
    """``verify`` with the gates formed in the kernel from the projection's ``b`` and ``a`` [lanes,
    rows, value_heads] (model dtype, heads contiguous) and the heads' ``a_log`` and ``dt_bias``: the
    same bits as ``verify`` given ``tfd_kernels.gdn_gates.gates(b, a, a_log, dt_bias)`` (the formed gates
    are what it logs), one launch less."""
    _, value_heads, _, _ = _check_rows(q, k, v, None, None, states, lead=2)
    for name, t in (("b", b), ("a", a)):
        _check(name, t, (*q.shape[:2], value_heads), q.dtype)
    for name, t in (("a_log", a_log), ("dt_bias", dt_bias)):
        _check(name, t, (value_heads,))
    _check_view("log", log)
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    _launch(q, k, v, Gates(a, b, a_log, dt_bias), states, state_at, spare_at, log, log_at, out, q.shape[1],
            scale, logging=True)
    return out


def replay(log: torch.Tensor, log_at: torch.Tensor, states: torch.Tensor, from_at: torch.Tensor,
           to_at: torch.Tensor, kept: torch.Tensor, *, key_heads: int, value_heads: int, key_dim: int,
           value_dim: int) -> None:
    """Per lane, the state at ``from_at`` after its first ``kept`` logged rows, written to ``to_at``
    (which may equal ``from_at``). The offsets are [lanes], or [layers, lanes] (contiguous) for
    layers of one shape in one launch, each lane keeping ``kept`` [lanes] rows in every layer."""
    lanes = kept.shape[0]
    _check_view("log", log)
    _check_view("states", states)
    shape = tuple(from_at.shape)
    if shape not in ((lanes,), (shape[0], lanes)):
        raise ValueError(f"from_at is {list(shape)}, expected [lanes] or [layers, lanes] for {lanes} lanes")
    for name, at in (("log_at", log_at), ("from_at", from_at), ("to_at", to_at)):
        _check(name, at, shape, torch.int64)
        if not at.is_contiguous():
            raise ValueError(f"{name} must be contiguous, its strides are {at.stride()}")
    _check("kept", kept, (lanes,), torch.int32)
    if value_heads % key_heads:
        raise ValueError(f"value_heads {value_heads} is not a multiple of key_heads {key_heads}")
    block_k, block_v = _blocks(key_dim, value_dim)
    grid = (triton.cdiv(value_dim, block_v), value_heads, from_at.numel())
    _replay[grid](log, log_at, states, from_at, to_at, kept, lanes, KEY_HEADS=key_heads,
                  VALUE_HEADS=value_heads, KEY_DIM=key_dim, VALUE_DIM=value_dim, BLOCK_K=block_k,
                  BLOCK_V=block_v, num_warps=NUM_WARPS, **pdl.options(log.device))

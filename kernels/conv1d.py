"""Depthwise causal conv with SiLU over the lanes' conv tails, the tails moved forward in place.

For channel c of a lane's input row i, with ``window`` the lane's tail (the last ``width - 1``
inputs, oldest first) followed by its new rows::

    out[i, c] = silu(cast(sum over taps t in order of window[i + t, c] * weight[c, t]))

in fp32, cast to the model dtype before the SiLU and after it; ``reference_lane`` is that arithmetic
for one lane, and the model's span path (tfd.model.gdn) uses it as its causal conv.
The tail then holds the last ``width - 1`` rows of the window. ``decode`` takes one row per lane
([lanes, channels]), ``prefill`` concatenated rows of several lanes split by ``cu_seqlens``.

The input's rows may sit at any stride (a slice of the projection, read in place); the output is
contiguous. Tails are [width - 1, channels] in the model dtype at element offsets ``tail_at`` into the pool's
view of that dtype. Besides the new output, memory written is only those tails. A lane whose
offset is -1 is padding: none of the pool is read or written for it and its output rows are
zeros. Every element is computed on its own, so a lane's bits never depend on the other lanes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import pdl

BLOCK_C = 256  # channels per program
BLOCK_T = 16  # prefill rows per program; at least width - 1, so only a lane's first block reads its tail
VERIFY_BLOCK_C = 64  # channels per program of a verify window


@triton.jit
def silu_out(acc, dtype: tl.constexpr):
    """The conv's output from its fp32 sum: cast to the model dtype, SiLU in fp32, cast again."""
    y = acc.to(dtype).to(tl.float32)
    return (y / (1.0 + tl.exp(-y))).to(dtype)


@triton.jit
def conv_loads(tail, row_live, cs, weight, tails, channels, WIDTH: tl.constexpr):
    """What the conv of one new row per lane reads (width 2 to 4), asked for at once: each row's
    tail rows (``tail`` its lanes' offsets, loaded; -1 for padding), the taps' weights, and where
    the rows are live (``row_live`` and not padding). Unread taps past the width repeat the first;
    for ``conv_apply``. Shared with the GEMM that forms the projection (tfd_kernels.gemm, decode rows)."""
    c_live = cs < channels
    live = ((tail >= 0) & row_live)[:, None] & c_live[None, :]
    o0 = tl.load(tails + tail[:, None] + cs[None, :], mask=live, other=0.0)
    w0 = tl.load(weight + cs * WIDTH, mask=c_live).to(tl.float32)
    o1, w1, o2, w2 = o0, w0, o0, w0
    if WIDTH > 2:
        o1 = tl.load(tails + tail[:, None] + channels + cs[None, :], mask=live, other=0.0)
        w1 = tl.load(weight + cs * WIDTH + 1, mask=c_live).to(tl.float32)
    if WIDTH > 3:
        o2 = tl.load(tails + tail[:, None] + 2 * channels + cs[None, :], mask=live, other=0.0)
        w2 = tl.load(weight + cs * WIDTH + 2, mask=c_live).to(tl.float32)
    return live, o0, o1, o2, w0, w1, w2, tl.load(weight + cs * WIDTH + WIDTH - 1, mask=c_live).to(tl.float32)


@triton.jit
def _tap(acc, value, weight, FMA: tl.constexpr):
    """acc + value * weight in fp32; with ``FMA`` one fused multiply-add, which is what a launch that
    contracts (every launch here, on the GPU) makes of the plain form: for a launch compiled not to."""
    wide = value.to(tl.float32)
    return tl.fma(wide, weight, acc) if FMA else acc + wide * weight


@triton.jit
def conv_apply(new, tail, live, o0, o1, o2, w0, w1, w2, w_new, cs, tails, channels, WIDTH: tl.constexpr,
               FMA: tl.constexpr = False):
    """One new row per lane (``new`` [rows, cs] in the model dtype; lane = row) through its tail,
    from ``conv_loads``' values: the arithmetic of ``_conv``, each lane's tail moved forward one row
    in place; rows not ``live`` give zeros and touch no tail. ``FMA``: the taps as explicit fused
    multiply-adds, the bits ``_conv`` has on the GPU, from a launch compiled without contraction
    (``tfd_kernels.fp8_gemm``'s; ``_conv``'s own PTX holds its taps as ``fma.rn.f32``)."""
    acc = _tap(tl.zeros(new.shape, tl.float32), o0, w0[None, :], FMA)  # taps in order, as the reference
    if WIDTH > 2:
        acc = _tap(acc, o1, w1[None, :], FMA)
    if WIDTH > 3:
        acc = _tap(acc, o2, w2[None, :], FMA)
    acc = _tap(acc, new, w_new[None, :], FMA)
    result = tl.where(live, silu_out(acc, new.dtype), 0.0).to(new.dtype)
    tl.debug_barrier()  # every thread's reads of the tails are done before they move
    if WIDTH > 2:
        tl.store(tails + tail[:, None] + cs[None, :], o1, mask=live)
    if WIDTH > 3:
        tl.store(tails + tail[:, None] + channels + cs[None, :], o2, mask=live)
    tl.store(tails + tail[:, None] + (WIDTH - 2) * channels + cs[None, :], new.to(tails.dtype.element_ty),
             mask=live)
    return result


@triton.jit
def _window(x, stride_x, tails, tail, start, j, cs, channels, live, WIDTH: tl.constexpr):
    # Rows j of a lane's window counted from its first new row: j >= 0 are inputs, j < 0 the tail.
    new = (j >= 0)[:, None]
    from_x = tl.load(x + (start + j)[:, None] * stride_x + cs[None, :], mask=live & new, other=0.0)
    from_tail = tl.load(tails + tail + (j + WIDTH - 1)[:, None] * channels + cs[None, :], mask=live & ~new,
                        other=0.0)
    return tl.where(new, from_x, from_tail)


@triton.jit
def _conv(x, stride_x, weight, tails, tail_at, out, start, rows, lane, first, channels,
          WIDTH: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_W: tl.constexpr,
          MOVE: tl.constexpr = True):
    """Rows ``first`` .. ``first + BLOCK_T`` of a lane's ``rows`` rows at ``start``; one channel block;
    the tail moves past them unless not ``MOVE`` (a verify window)."""
    i = first + tl.arange(0, BLOCK_T)
    cs = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_live = cs < channels
    live = (i < rows)[:, None] & c_live[None, :]
    targets = out + (start + i)[:, None] * channels + cs[None, :]
    tail = tl.load(tail_at + lane)
    if tail < 0:
        tl.store(targets, tl.zeros([BLOCK_T, BLOCK_C], out.dtype.element_ty), mask=live)
        return
    acc = tl.zeros([BLOCK_T, BLOCK_C], tl.float32)
    for tap in tl.static_range(WIDTH):  # taps in order, as the reference sums them
        value = _window(x, stride_x, tails, tail, start, i + tap - (WIDTH - 1), cs, channels, live, WIDTH)
        w = tl.load(weight + cs * WIDTH + tap, mask=c_live).to(tl.float32)
        acc = acc + value.to(tl.float32) * w[None, :]
    tl.store(targets, silu_out(acc, out.dtype.element_ty), mask=live)
    if MOVE:  # noqa: SIM102 (a constexpr `and` would still trace the tensor test)
        if first == 0:  # the only block that read the old tail writes the new one
            t = tl.arange(0, BLOCK_W)
            keep = (t < WIDTH - 1)[:, None] & c_live[None, :]
            fresh = _window(x, stride_x, tails, tail, start, rows + t - (WIDTH - 1), cs, channels, keep,
                            WIDTH)
            tl.debug_barrier()  # every thread's reads of the old tail come before any write to it
            tl.store(tails + tail + t[:, None] * channels + cs[None, :], fresh, mask=keep)


@triton.jit
def _decode(x, stride_x, weight, tails, tail_at, out, channels,
            WIDTH: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_W: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    lane = tl.program_id(1)
    _conv(x, stride_x, weight, tails, tail_at, out, lane, 1, lane, 0, channels, WIDTH, 1, BLOCK_C, BLOCK_W)


@triton.jit
def _prefill(x, stride_x, weight, tails, tail_at, out, cu_seqlens, channels,
             WIDTH: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_W: tl.constexpr,
             PDL: tl.constexpr):
    pdl.wait(PDL)
    first, lane = tl.program_id(1) * BLOCK_T, tl.program_id(2)
    start = tl.load(cu_seqlens + lane)
    rows = tl.load(cu_seqlens + lane + 1) - start
    if (first == 0) | (first < rows):  # blocks past a lane's rows have nothing to do
        _conv(x, stride_x, weight, tails, tail_at, out, start, rows, lane, first, channels, WIDTH, BLOCK_T,
              BLOCK_C, BLOCK_W)


@triton.jit
def _verify(x, stride_x, weight, tails, tail_at, out, rows_at, rows, channels,
            WIDTH: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_W: tl.constexpr,
            PDL: tl.constexpr):
    pdl.wait(PDL)
    first, lane = tl.program_id(1) * BLOCK_T, tl.program_id(2)
    _conv(x, stride_x, weight, tails, tail_at, out, lane * rows, rows, lane, first, channels, WIDTH, BLOCK_T,
          BLOCK_C, BLOCK_W, False)
    at = tl.load(rows_at + lane)
    if at >= 0:  # the window's inputs, for the commit's tail
        i = first + tl.arange(0, BLOCK_T)
        cs = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
        live = (i < rows)[:, None] & (cs < channels)[None, :]
        inputs = tl.load(x + (lane * rows + i)[:, None] * stride_x + cs[None, :], mask=live)
        tl.store(tails + at + i[:, None] * channels + cs[None, :], inputs, mask=live)


@triton.jit
def _rebuild(tails, tail_at, rows_at, keep, lanes, channels, WIDTH: tl.constexpr, BLOCK_C: tl.constexpr,
             BLOCK_W: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    pair = tl.program_id(1)  # layer * lanes + lane
    tail = tl.load(tail_at + pair)
    if tail >= 0:
        at = tl.load(rows_at + pair)
        cs = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
        t = tl.arange(0, BLOCK_W)
        valid = (t < WIDTH - 1)[:, None] & (cs < channels)[None, :]
        j = tl.load(keep + pair % lanes).to(tl.int64) + t  # row j of [old tail; window inputs]
        old = (j < WIDTH - 1)[:, None]
        from_tail = tl.load(tails + tail + j[:, None] * channels + cs[None, :], mask=valid & old, other=0.0)
        from_rows = tl.load(tails + at + (j - (WIDTH - 1))[:, None] * channels + cs[None, :],
                            mask=valid & ~old, other=0.0)
        tl.debug_barrier()  # every thread's reads of the old tail come before any write to it
        tl.store(tails + tail + t[:, None] * channels + cs[None, :], tl.where(old, from_tail, from_rows),
                 mask=valid)


def _check(x: torch.Tensor, weight: torch.Tensor, tails: torch.Tensor, tail_at: torch.Tensor,
           lanes: int) -> int:
    """The conv width, once the arguments shared by decode and prefill are checked."""
    if x.dim() != 2:
        raise ValueError(f"x must be [rows, channels], got {list(x.shape)}")
    return checked_width(x.shape[1], x.dtype, weight, tails, tail_at, lanes)


def checked_width(channels: int, dtype: torch.dtype, weight: torch.Tensor, tails: torch.Tensor,
                  tail_at: torch.Tensor, lanes: int) -> int:
    """The conv width of ``weight`` for ``lanes`` rows of ``channels`` in ``dtype``, once the
    weight, the tails' view and the offsets are checked (ValueError naming the one at fault)."""
    if weight.dim() != 2 or weight.shape[0] != channels or weight.shape[1] < 2:
        raise ValueError(f"weight must be [{channels}, width >= 2], got {list(weight.shape)}")
    if tails.dim() != 1 or tails.dtype != dtype:
        raise ValueError(f"tails must be the pool's 1-D view as {dtype}, got {tails.dtype} {tails.dim()}-D")
    if tuple(tail_at.shape) != (lanes,) or tail_at.dtype != torch.int64 or not tail_at.is_contiguous():
        raise ValueError(f"tail_at must be contiguous int64 [{lanes}], got {tail_at.dtype} "
                         f"{list(tail_at.shape)} strides {tail_at.stride()}")
    return int(weight.shape[1])


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as read: its rows at any stride (the conv input is a slice of the GDN projection), its
    channels contiguous."""
    return x if x.stride(1) == 1 else x.contiguous()


def decode(x: torch.Tensor, weight: torch.Tensor, tails: torch.Tensor, tail_at: torch.Tensor) -> torch.Tensor:
    """One row per lane, x [lanes, channels]; the lanes' tails move forward one row."""
    width = _check(x, weight, tails, tail_at, x.shape[0])
    x, weight = _rows(x), weight.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(x.shape[1], BLOCK_C), x.shape[0])
    _decode[grid](x, x.stride(0), weight, tails, tail_at, out, x.shape[1], WIDTH=width, BLOCK_C=BLOCK_C,
                  BLOCK_W=triton.next_power_of_2(width - 1), **pdl.options(x.device))
    return out


def prefill(x: torch.Tensor, weight: torch.Tensor, tails: torch.Tensor, tail_at: torch.Tensor,
            cu_seqlens: torch.Tensor, max_rows: int) -> torch.Tensor:
    """Lane l's rows are x[cu_seqlens[l]:cu_seqlens[l + 1]]; ``max_rows`` bounds every lane's count
    (it sizes the grid, so the launch reads nothing back from the device)."""
    lanes = tail_at.shape[0]
    width = _check(x, weight, tails, tail_at, lanes)
    if tuple(cu_seqlens.shape) != (lanes + 1,) or cu_seqlens.dtype != torch.int32:
        raise ValueError(f"cu_seqlens must be int32 [{lanes + 1}], got {cu_seqlens.dtype} "
                         f"{list(cu_seqlens.shape)}")
    if width - 1 > BLOCK_T:
        raise ValueError(f"weight's width {width} is over {BLOCK_T + 1}")
    x, weight = _rows(x), weight.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(x.shape[1], BLOCK_C), max(1, triton.cdiv(max_rows, BLOCK_T)), lanes)
    _prefill[grid](x, x.stride(0), weight, tails, tail_at, out, cu_seqlens, x.shape[1], WIDTH=width,
                   BLOCK_T=BLOCK_T, BLOCK_C=BLOCK_C, BLOCK_W=triton.next_power_of_2(width - 1),
                   **pdl.options(x.device))
    return out


def verify(x: torch.Tensor, weight: torch.Tensor, tails: torch.Tensor, tail_at: torch.Tensor,
           rows_at: torch.Tensor) -> torch.Tensor:
    """Verify windows: x [lanes * rows, channels], a lane's ``rows`` rows together, each through its
    tail as decoding them one by one would (the same bits a row), the tails left as they are; each
    live lane's inputs are kept at ``rows_at`` (element offsets into ``tails``, [rows, channels])."""
    lanes = tail_at.shape[0]
    width = _check(x, weight, tails, tail_at, lanes)
    if x.shape[0] % max(lanes, 1) or tuple(rows_at.shape) != (lanes,) or rows_at.dtype != torch.int64:
        raise ValueError(f"x's {x.shape[0]} rows must be whole windows of {lanes} lanes and rows_at int64 "
                         f"[{lanes}], got {rows_at.dtype} {list(rows_at.shape)}")
    rows = x.shape[0] // max(lanes, 1)
    x, weight = _rows(x), weight.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    # a window is a few rows: one block of them, and narrow channel blocks for more programs (the
    # tail is only read here, so no block size bounds it; each element's sum is the same either way)
    block_t = triton.next_power_of_2(max(rows, 2))
    grid = (triton.cdiv(x.shape[1], VERIFY_BLOCK_C), max(1, triton.cdiv(rows, block_t)), lanes)
    _verify[grid](x, x.stride(0), weight, tails, tail_at, out, rows_at.contiguous(), rows, x.shape[1],
                  WIDTH=width, BLOCK_T=block_t, BLOCK_C=VERIFY_BLOCK_C,
                  BLOCK_W=triton.next_power_of_2(width - 1), **pdl.options(x.device))
    return out


def rebuild(tails: torch.Tensor, tail_at: torch.Tensor, rows_at: torch.Tensor, keep: torch.Tensor,
            width: int, channels: int) -> None:
    """After a verify window: each live lane's tail becomes the last ``width - 1`` rows of [its old
    tail; the first ``keep[l]`` (int32, at least 1) inputs kept at ``rows_at``], as decoding those
    rows would leave it. The offsets are [lanes], or [layers, lanes] for layers of one shape in one
    launch."""
    lanes = keep.shape[0]
    if tuple(tail_at.shape) not in ((lanes,), (tail_at.shape[0], lanes)) or rows_at.shape != tail_at.shape:
        raise ValueError(f"tail_at {list(tail_at.shape)} and rows_at {list(rows_at.shape)} must be [lanes] "
                         f"or [layers, lanes] for {lanes} lanes")
    grid = (triton.cdiv(channels, BLOCK_C), tail_at.numel())
    _rebuild[grid](tails, tail_at.contiguous(), rows_at.contiguous(), keep.contiguous(), lanes, channels,
                   WIDTH=width, BLOCK_C=BLOCK_C, BLOCK_W=triton.next_power_of_2(width - 1),
                   **pdl.options(tails.device))


def reference_verify(x: torch.Tensor, weight: torch.Tensor, tails: torch.Tensor, tail_at: torch.Tensor,
                     rows_at: torch.Tensor) -> torch.Tensor:
    """``verify`` in torch, a lane at a time, each on a copy of its tail."""
    lanes, channels, width = tail_at.shape[0], x.shape[1], weight.shape[1]
    rows = x.shape[0] // max(lanes, 1)
    out = torch.zeros_like(x)
    for lane, (at, kept) in enumerate(zip(tail_at.tolist(), rows_at.tolist(), strict=True)):
        window = x[lane * rows:(lane + 1) * rows]
        if at >= 0:
            tail = tails[at:at + (width - 1) * channels].view(-1, channels).clone()
            out[lane * rows:(lane + 1) * rows] = reference_lane(window, weight, tail)
        if kept >= 0:
            tails[kept:kept + rows * channels] = window.flatten().to(tails.dtype)
    return out


def reference_rebuild(tails: torch.Tensor, tail_at: torch.Tensor, rows_at: torch.Tensor, keep: torch.Tensor,
                      width: int, channels: int) -> None:
    """``rebuild`` in torch, a lane at a time."""
    size = (width - 1) * channels
    layers = tail_at.numel() // keep.shape[0]
    for at, kept, count in zip(tail_at.flatten().tolist(), rows_at.flatten().tolist(), keep.tolist() * layers,
                               strict=True):
        if at >= 0:
            inputs = tails[kept:kept + (count + width - 1) * channels]
            window = torch.cat((tails[at:at + size], inputs))[:(count + width - 1) * channels]
            tails[at:at + size] = window[count * channels:].clone()


def reference_lane(x: torch.Tensor, weight: torch.Tensor, tail: torch.Tensor) -> torch.Tensor:
    """Depthwise causal conv of one lane's rows ``x`` [rows, channels] with ``tail`` [width - 1,
    channels] before them, then SiLU; ``tail`` moves forward in place."""
    rows, width = x.shape[0], weight.shape[1]
    window = torch.cat((tail.to(x.dtype), x))
    acc = window[0:rows].float() * weight[:, 0].float()
    for tap in range(1, width):
        acc = acc + window[tap:tap + rows].float() * weight[:, tap].float()
    tail.copy_(window[-(width - 1):])
    y = acc.to(x.dtype).float()
    return (y / (1.0 + torch.exp(-y))).to(x.dtype)


def reference(x: torch.Tensor, weight: torch.Tensor, tails: torch.Tensor,
              tail_at: torch.Tensor) -> torch.Tensor:
    """``decode`` in torch, a lane at a time."""
    return reference_prefill(x, weight, tails, tail_at,
                             torch.arange(x.shape[0] + 1, dtype=torch.int32, device=x.device))


def reference_prefill(x: torch.Tensor, weight: torch.Tensor, tails: torch.Tensor, tail_at: torch.Tensor,
                      cu_seqlens: torch.Tensor, max_rows: int | None = None) -> torch.Tensor:
    """``prefill`` in torch, a lane at a time (``max_rows`` is not needed here)."""
    del max_rows
    out = torch.zeros_like(x)
    size = (weight.shape[1] - 1) * x.shape[1]
    bounds = cu_seqlens.tolist()
    for lane, at in enumerate(tail_at.tolist()):
        if at >= 0:
            a, b = bounds[lane], bounds[lane + 1]
            out[a:b] = reference_lane(x[a:b], weight, tails[at:at + size].view(-1, x.shape[1]))
    return out

"""Flash Next's per-layer embedding at decode rows: a lane's n-gram table rows and its dilated conv,
each with the lane's history or tail moved past the row, a launch each where torch took about forty
(``tfd.model.ple.ple_rows``).

``ngram``: one token a lane and its last ``n - 1`` ids (an EOS cuts every older one) hashed into each
head's table: the int64 products that wrap, their xors, the remainder taken non-negative (torch's
``remainder``), the head's offset added, as ``tfd.model.ple.ngram_rows`` does; then the history
moved past the token. ``conv``: the depthwise dilated conv of the lane's tail and its new row in
fp32, products and sums in tap order, unfused (the compiler would contract each pair into an fma,
which torch's separate ops do not), so the bits of ``tfd.model.ple._conv``; then the tail moved past
the row. A padding lane (offset -1) hashes an EOS history, convolves the pool's first elements as
the torch path does (values no one uses: another lane's program may be moving them) and stores
nothing.

Memory: each reads a lane's history or tail once and writes it once in place (a program owns its
lane's, or its columns of it), plus the ids or the conv [lanes, channels] fp32. Grids follow shapes
only, so the decode graphs capture both.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import pdl

BLOCK = 1024  # channels a conv program takes
MOST_NGRAM = 4  # n-gram sizes the hash takes (its multipliers are scalar arguments)


@triton.jit
def _ngram(tokens, histories, history_at, sizes, offsets, ids, eos, m0, m1, m2, m3, N: tl.constexpr,
           PER: tl.constexpr, PER_PAD: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    lane = tl.program_id(0)
    at = tl.load(history_at + lane)
    token = tl.load(tokens + lane).to(tl.int64)
    heads = tl.arange(0, PER_PAD)
    mixed = token * m0
    cut = token != token  # nothing cut yet
    for lag in tl.static_range(1, N):
        earlier = tl.load(histories + tl.maximum(at, 0) + (N - 1 - lag), mask=at >= 0, other=eos).to(tl.int64)
        multiplier = m1 if lag == 1 else (m2 if lag == 2 else m3)
        mixed = mixed ^ (tl.where(cut, eos, earlier).to(tl.int64) * multiplier)
        cut = cut | (earlier == eos)
        column = (lag - 1) * PER + heads
        live = heads < PER
        size = tl.load(sizes + column, mask=live, other=1)
        rest = mixed % size
        rest = tl.where(rest < 0, rest + size, rest)  # torch's remainder takes the divisor's sign
        tl.store(ids + lane * ((N - 1) * PER) + column, rest + tl.load(offsets + column, mask=live, other=0),
                 mask=live)
    if at >= 0:  # the history moved past the token
        for i in tl.static_range(N - 2):
            tl.store(histories + at + i, tl.load(histories + at + i + 1))
        tl.store(histories + at + (N - 2), token)


def ngram(tokens: torch.Tensor, histories: torch.Tensor, history_at: torch.Tensor,
          multipliers: tuple[int, ...], sizes: torch.Tensor, offsets: torch.Tensor, eos: int) -> torch.Tensor:
    """Table rows int64 [lanes, heads] of one token a lane (``tokens`` [lanes]) after its history of
    ``len(multipliers) - 1`` ids in ``histories`` (int64) at ``history_at`` [lanes] (int64, -1: an
    EOS history, nothing stored): bigram heads first; then each history moved past its token."""
    n, heads = len(multipliers), sizes.shape[0]
    if not 2 <= n <= MOST_NGRAM or heads % (n - 1) or offsets.shape != sizes.shape \
            or history_at.shape != tokens.shape or history_at.dtype != torch.int64 \
            or histories.dtype != torch.int64:
        raise ValueError(f"n-grams of {n} ({len(multipliers)} multipliers, 2 to {MOST_NGRAM}), sizes "
                         f"{list(sizes.shape)}, offsets {list(offsets.shape)}, tokens {list(tokens.shape)}, "
                         f"history_at {history_at.dtype} {list(history_at.shape)}, histories "
                         f"{histories.dtype}: want heads a multiple of n - 1 and int64 offsets into an int64 "
                         "history")
    lanes, per = tokens.shape[0], heads // (n - 1)
    ids = torch.empty(lanes, heads, dtype=torch.int64, device=tokens.device)
    if lanes:
        m = (*multipliers, *([0] * (MOST_NGRAM - n)))
        _ngram[(lanes,)](tokens, histories, history_at, sizes, offsets, ids, eos, *m, N=n, PER=per,
                         PER_PAD=triton.next_power_of_2(per), **pdl.options(tokens.device))
    return ids


@triton.jit
def _conv(normed, tails, tail_at, weight, out, channels, stride_n, KERNEL: tl.constexpr,
          DILATION: tl.constexpr, TAPS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    lane, tile = tl.program_id(0), tl.program_id(1)
    cols = tile * BLOCK + tl.arange(0, BLOCK)
    live = cols < channels
    at = tl.load(tail_at + lane)
    base = tails + tl.maximum(at, 0)
    new = tl.load(normed + lane * stride_n + cols, mask=live, other=0.0)
    first = tl.load(base + cols, mask=live, other=0.0)  # the window's row 0: the tail's oldest
    total = first.to(tl.float32) * tl.load(weight + cols * KERNEL, mask=live, other=0.0).to(tl.float32)
    for tap in tl.static_range(1, KERNEL):
        at_tap = tap * DILATION  # the window's row [tail; new]
        value = new if at_tap == TAPS else tl.load(base + at_tap * channels + cols, mask=live, other=0.0)
        w = tl.load(weight + cols * KERNEL + tap, mask=live, other=0.0).to(tl.float32)
        total = total + value.to(tl.float32) * w
    tl.store(out + lane * channels + cols, total, mask=live)
    if at >= 0:  # the tail moved past the row: each row one later, the new row last
        for moved in tl.static_range(TAPS - 1):
            tl.store(base + moved * channels + cols, tl.load(base + (moved + 1) * channels + cols, mask=live),
                     mask=live)
        tl.store(base + (TAPS - 1) * channels + cols, new.to(tails.dtype.element_ty), mask=live)


def conv(normed: torch.Tensor, tails: torch.Tensor, tail_at: torch.Tensor, weight: torch.Tensor,
         dilation: int) -> torch.Tensor:
    """fp32 [lanes, channels]: the dilated depthwise conv (``weight`` [channels, kernel]) of each
    lane's tail of ``(kernel - 1) * dilation`` rows in ``tails`` at ``tail_at`` [lanes] (int64
    element offsets; -1 stores nothing) followed by its row of ``normed`` [lanes, channels]; then
    each tail moved past its row."""
    lanes, channels = normed.shape
    kernel = weight.shape[1] if weight.dim() == 2 else 0
    if weight.shape != (channels, kernel) or kernel < 2 or dilation < 1 or tail_at.shape != (lanes,) \
            or tail_at.dtype != torch.int64 or normed.stride(1) != 1 or tails.dtype != normed.dtype:
        raise ValueError(f"normed {normed.dtype} {list(normed.shape)}, weight {list(weight.shape)}, "
                         f"dilation {dilation}, tail_at {tail_at.dtype} {list(tail_at.shape)}, tails "
                         f"{tails.dtype}: want [lanes, channels] (unit column stride), [channels, kernel >= "
                         "2], a dilation of 1 or more, int64 [lanes], the same dtype")
    out = torch.empty(lanes, channels, dtype=torch.float32, device=normed.device)
    if lanes:
        # unfused: each product and sum rounded apart, as torch's ops round them
        _conv[(lanes, triton.cdiv(channels, BLOCK))](
            normed, tails, tail_at, weight.contiguous(), out, channels, normed.stride(0), KERNEL=kernel,
            DILATION=dilation, TAPS=(kernel - 1) * dilation, BLOCK=BLOCK, enable_fp_fusion=False,
            **pdl.options(normed.device))
    return out

"""Flash Next's per-layer embedding: hashed 2- and 3-gram rows gate a value into every stream,
and a dilated causal conv adds local context (reference/model.md 3.6 and 3.7).

Per lane it keeps the last two token ids (the n-gram history, [EOS, EOS] at the start) and the
conv's tail, the last ``(kernel - 1) * dilation`` normalised gated values. A token's context stops
after the last EOS before it; its own EOS does not cut it.

``ple`` runs one lane's rows through its piece views (the span path); ``ple_rows`` one row of each
lane of a batched decode step through the pool at the lanes' offsets, with the same arithmetic a row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import torch

from tfd.model.fp8 import Weight
from tfd.model.ops import linear, row_sums, sigmoid, silu, zrms
from tfd_kernels import lane_rows
from tfd_kernels import ple_rows as ple_kernels


@attrs.frozen
class PleWeights:
    key: Weight  # [streams * width, embed]
    value: Weight  # [width, embed]
    norm_key: torch.Tensor  # [streams * width], zero-centred, per stream
    norm_query: torch.Tensor
    norm_conv: torch.Tensor
    conv: torch.Tensor  # [streams * width, kernel], depthwise
    table: torch.Tensor  # [rows, dim]: the hashed n-gram rows, every head's in one table
    multipliers: tuple[int, ...]  # one per n-gram position (3)
    sizes: torch.Tensor  # [heads] int64: each head's prime table size
    offsets: torch.Tensor  # [heads] int64: where each head's rows start
    heads_per_ngram: int
    eos: int
    dilation: int
    streams: int
    width: int
    eps: float

    @property
    def taps(self) -> int:
        """Columns of history the conv reads: (kernel - 1) * dilation."""
        return (self.conv.shape[1] - 1) * self.dilation


def _hashed(w: PleWeights, lagged: Sequence[torch.Tensor]) -> torch.Tensor:
    """Table rows [rows, heads] from each row's token ids at lags 0, 1, 2 (EOS where cut)."""
    mixed = lagged[0] * w.multipliers[0]
    hashed = []
    for lag in range(1, len(w.multipliers)):
        mixed = torch.bitwise_xor(mixed, lagged[lag] * w.multipliers[lag])
        hashed.append(mixed[:, None].expand(-1, w.heads_per_ngram))
    return torch.remainder(torch.cat(hashed, dim=1), w.sizes) + w.offsets


def ngram_ids(w: PleWeights, history: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Table rows [rows, heads] of each token: bigram heads first, then trigram heads."""
    context = torch.cat((history.to(tokens), tokens)).long()
    index = torch.arange(context.shape[0], device=tokens.device)
    eos_at = torch.where(context == w.eos, index, torch.full_like(index, -1))
    # A token's segment starts after the last EOS strictly before it.
    before = torch.cat((eos_at.new_full((1,), -1), torch.cummax(eos_at, dim=0).values[:-1]))
    segment = before + 1
    lagged = []
    for lag in range(len(w.multipliers)):
        source = index - lag
        keep = source >= segment
        lagged.append(torch.where(keep, context[source.clamp_min(0)], torch.full_like(context, w.eos)))
    return _hashed(w, lagged)[history.shape[0]:]


def ngram_rows(w: PleWeights, histories: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``ngram_ids`` of one token a lane: ``histories`` [lanes, ngram - 1] (oldest first), ``tokens``
    [lanes]. An EOS in the history cuts every older id, as the segment rule does."""
    lagged, cut = [tokens.long()], torch.zeros_like(tokens, dtype=torch.bool)
    for lag in range(1, len(w.multipliers)):
        earlier = histories[:, -lag].long()
        lagged.append(torch.where(cut, w.eos, earlier))
        cut = cut | (earlier == w.eos)
    return _hashed(w, lagged)


def _gate(w: PleWeights, stack: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated values [rows, streams * width] for the residual ``stack`` and table rows ``ids``,
    and their normalised form, the conv's input."""
    split = (w.streams, w.width)
    embedded = w.table[ids].flatten(-2).to(stack.dtype)
    keys = torch.unflatten(zrms(linear(embedded, w.key), w.norm_key, w.eps, group=w.width), -1, split)
    value = linear(embedded, w.value)
    queries = torch.unflatten(zrms(stack, w.norm_query, w.eps, group=w.width), -1, split)
    score = row_sums(keys * queries)[..., None] / math.sqrt(w.width)
    score = score.abs().clamp_min(1e-6).sqrt() * score.sign()
    gated = (sigmoid(score) * value[:, None, :]).flatten(-2)
    return gated, zrms(gated, w.norm_conv, w.eps, group=w.width)


def _conv(w: PleWeights, window: torch.Tensor) -> torch.Tensor:
    """The dilated conv (fp32) of the rows after the tail in ``window`` [..., taps + rows, channels]."""
    rows = window.shape[-2] - w.taps
    conv = window[..., 0:rows, :].float() * w.conv[:, 0].float()
    for tap in range(1, w.conv.shape[1]):
        start = tap * w.dilation
        conv = conv + window[..., start:start + rows, :].float() * w.conv[:, tap].float()
    return conv


def ple(w: PleWeights, stack: torch.Tensor, tokens: torch.Tensor, tail: torch.Tensor,
        history: torch.Tensor) -> torch.Tensor:
    """What PLE adds to the residual ``stack`` [rows, streams * width] for these ``tokens``.

    Moves the lane's ``tail`` and ``history`` views past the rows.
    """
    gated, normed = _gate(w, stack, ngram_ids(w, history, tokens))
    window = torch.cat((tail.to(normed.dtype), normed))
    conv = _conv(w, window)
    tail.copy_(window[-w.taps:])
    history.copy_(torch.cat((history.to(tokens), tokens))[-history.shape[0]:])
    return gated + silu(conv.to(stack.dtype))


def ple_rows(w: PleWeights, stack: torch.Tensor, tokens: torch.Tensor, tails: torch.Tensor,
             tail_at: torch.Tensor, histories: torch.Tensor, history_at: torch.Tensor) -> torch.Tensor:
    """``ple`` for one row a lane, batched: ``stack`` [lanes, streams * width], ``tokens`` [lanes].

    Each lane's conv tail and n-gram history sit in the pool views ``tails`` (the model dtype) and
    ``histories`` (int64) at element offsets ``tail_at`` / ``history_at`` [lanes] (int64): read by
    gathers, moved past the row by ``tfd_kernels.lane_rows``; on CUDA the ids and the conv with their
    moves are ``tfd_kernels.ple_rows``' two launches, the same arithmetic. A padding lane (offsets -1)
    reads the pool's first elements, hashes an EOS history and stores nothing."""
    if stack.is_cuda:
        ids = ple_kernels.ngram(tokens, histories, history_at, w.multipliers, w.sizes, w.offsets, w.eos)
        gated, normed = _gate(w, stack, ids)
        conv = ple_kernels.conv(normed, tails, tail_at, w.conv, w.dilation)
        return gated + silu(conv.to(stack.dtype))
    lanes, kept = tokens.shape[0], len(w.multipliers) - 1
    history = histories[history_at.clamp_min(0)[:, None] + torch.arange(kept, device=tokens.device)]
    history = torch.where((history_at >= 0)[:, None], history, w.eos)
    gated, normed = _gate(w, stack, ngram_rows(w, history, tokens))
    width = normed.shape[1]
    span = torch.arange(w.taps * width, device=tokens.device)
    tail = tails[tail_at.clamp_min(0)[:, None] + span].view(lanes, w.taps, width)
    window = torch.cat((tail.to(normed.dtype), normed[:, None, :]), dim=1)
    lane_rows.reference(window[:, 1:].reshape(lanes, -1), tails, tail_at)
    lane_rows.reference(torch.cat((history[:, 1:], tokens[:, None].long()), dim=1), histories, history_at)
    return gated + silu(_conv(w, window)[:, 0].to(stack.dtype))


def ple_window(w: PleWeights, stack: torch.Tensor, tokens: torch.Tensor, rows: int, tails: torch.Tensor,
               tail_at: torch.Tensor, histories: torch.Tensor, history_at: torch.Tensor,
               kept_at: torch.Tensor) -> torch.Tensor:
    """``ple_rows`` for verify windows of ``rows`` rows a lane (``stack`` [lanes * rows, streams *
    width], ``tokens`` [lanes * rows], a lane's rows together): row i reads the lane's history and
    tail followed by rows before it, as decoding them one by one would, and neither moves; each
    live lane's conv inputs are kept at ``kept_at`` (element offsets into ``tails``, [rows, width])
    for ``ple_commit``."""
    lanes, kept = tail_at.shape[0], len(w.multipliers) - 1
    device = tokens.device
    history = histories[history_at.clamp_min(0)[:, None] + torch.arange(kept, device=device)]
    history = torch.where((history_at >= 0)[:, None], history, w.eos)
    context = torch.cat((history, tokens.view(lanes, rows).long()), dim=1)
    before = context.unfold(1, kept, 1)[:, :rows].reshape(-1, kept)  # each row's history: the ids before it
    gated, normed = _gate(w, stack, ngram_rows(w, before, tokens))
    width = normed.shape[1]
    span = torch.arange(w.taps * width, device=device)
    tail = tails[tail_at.clamp_min(0)[:, None] + span].view(lanes, w.taps, width)
    window = torch.cat((tail.to(normed.dtype), normed.view(lanes, rows, width)), dim=1)
    store = lane_rows.store if stack.is_cuda else lane_rows.reference
    store(normed.view(lanes, rows * width).to(tails.dtype).contiguous(), tails, kept_at)
    return gated + silu(_conv(w, window).view(lanes * rows, width).to(stack.dtype))


def ple_commit(w: PleWeights, tokens: torch.Tensor, keep: torch.Tensor, tails: torch.Tensor,
               tail_at: torch.Tensor, histories: torch.Tensor, history_at: torch.Tensor,
               kept_at: torch.Tensor) -> None:
    """After ``ple_window``: each live lane's tail and history as decoding its first ``keep`` rows
    (int [lanes]) of the window (``tokens`` [lanes, rows]) leaves them: the last rows of [old tail;
    kept inputs] and the last ids of [old history; kept tokens]."""
    lanes, rows = tokens.shape
    kept, device = len(w.multipliers) - 1, tokens.device
    width = w.streams * w.width
    span = torch.arange(w.taps * width, device=device)
    old = tails[tail_at.clamp_min(0)[:, None] + span].view(lanes, w.taps, width)
    inputs = tails[kept_at.clamp_min(0)[:, None] + torch.arange(rows * width, device=device)]
    window = torch.cat((old, inputs.view(lanes, rows, width)), dim=1)
    picks = keep.long()[:, None] + torch.arange(w.taps, device=device)
    tail = window.gather(1, picks[:, :, None].expand(-1, -1, width))
    history = histories[history_at.clamp_min(0)[:, None] + torch.arange(kept, device=device)]
    ids = torch.cat((history, tokens.long()), dim=1).gather(1, keep.long()[:, None] + torch.arange(
        kept, device=device))
    store = lane_rows.store if tails.is_cuda else lane_rows.reference
    store(tail.reshape(lanes, -1).contiguous(), tails, tail_at)
    store(ids.contiguous(), histories, history_at)

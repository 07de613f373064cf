"""Flash Next's per-layer embedding: hashed 2- and 3-gram rows gate a value into every stream,
and a dilated causal conv adds local context (reference/model.md 3.6 and 3.7).

Per lane it keeps the last two token ids (the n-gram history, [EOS, EOS] at the start) and the
conv's tail, the last ``(kernel - 1) * dilation`` normalised gated values. A token's context stops
after the last EOS before it; its own EOS does not cut it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import torch

from tfd.model.ops import linear, sigmoid, silu, zrms


@attrs.frozen
class NgramTable:
    """The n-gram embedding rows, possibly in shards of equal height (read a few rows a token)."""

    shards: Sequence[torch.Tensor]

    @property
    def dim(self) -> int:
        return int(self.shards[0].shape[1])

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` [rows, heads] as [rows, heads * dim], on ``ids``' device."""
        height = self.shards[0].shape[0]
        if len(self.shards) == 1:
            found = self.shards[0][ids.to(self.shards[0].device)]
        else:
            flat = ids.flatten().tolist()
            found = torch.stack([self.shards[i // height][i % height] for i in flat]).view(*ids.shape, -1)
        return found.to(ids.device).flatten(-2)


@attrs.frozen
class PleWeights:
    key: torch.Tensor  # [streams * width, embed]
    value: torch.Tensor  # [width, embed]
    norm_key: torch.Tensor  # [streams * width], zero-centred, per stream
    norm_query: torch.Tensor
    norm_conv: torch.Tensor
    conv: torch.Tensor  # [streams * width, kernel], depthwise
    table: NgramTable
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
    mixed = lagged[0] * w.multipliers[0]
    hashed = []
    for lag in range(1, len(w.multipliers)):
        mixed = torch.bitwise_xor(mixed, lagged[lag] * w.multipliers[lag])
        hashed.append(mixed[:, None].expand(-1, w.heads_per_ngram))
    first = history.shape[0]
    return (torch.remainder(torch.cat(hashed, dim=1), w.sizes) + w.offsets)[first:]


def ple(w: PleWeights, stack: torch.Tensor, tokens: torch.Tensor, tail: torch.Tensor,
        history: torch.Tensor) -> torch.Tensor:
    """What PLE adds to the residual ``stack`` [rows, streams * width] for these ``tokens``.

    Moves the lane's ``tail`` and ``history`` views past the rows.
    """
    rows, split = stack.shape[0], (w.streams, w.width)
    embedded = w.table.lookup(ngram_ids(w, history, tokens)).to(stack.dtype)
    keys = torch.unflatten(zrms(linear(embedded, w.key), w.norm_key, w.eps, group=w.width), -1, split)
    value = linear(embedded, w.value)
    queries = torch.unflatten(zrms(stack, w.norm_query, w.eps, group=w.width), -1, split)
    score = (keys * queries).sum(dim=-1, keepdim=True) / math.sqrt(w.width)
    score = score.abs().clamp_min(1e-6).sqrt() * score.sign()
    gated = (sigmoid(score) * value[:, None, :]).flatten(-2)
    normed = zrms(gated, w.norm_conv, w.eps, group=w.width)

    window = torch.cat((tail.to(normed.dtype), normed))
    conv = window[0:rows].float() * w.conv[:, 0].float()
    for tap in range(1, w.conv.shape[1]):
        start = tap * w.dilation
        conv = conv + window[start:start + rows].float() * w.conv[:, tap].float()
    tail.copy_(window[-w.taps:])
    history.copy_(torch.cat((history.to(tokens), tokens))[-history.shape[0]:])
    return gated + silu(conv.to(stack.dtype))

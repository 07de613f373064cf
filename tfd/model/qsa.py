"""Qwen Sparse Attention's indexer (reference/model.md 3.4): which positions a query attends.

Raw index keys are kept per position, before norm and RoPE. When a block of ``block`` positions
completes, its pooled key (mean of the raw keys in fp32, cast back, normed, rotated at the block's
first position) is kept too; completed blocks never change. A query at position p scores every
complete block: sum over index heads of relu(q_h . K_b) / sqrt(dim) in fp32, takes the best
``budget / block`` (ties to the lower block), and adds the incomplete tail up to p.
"""

from __future__ import annotations

import math

import attrs
import torch

from tfd.model.memory import PageRows, Span
from tfd.model.ops import linear, zrms
from tfd.model.rope import Rotary


@attrs.frozen
class IndexerWeights:
    qk: torch.Tensor  # [(heads + 1) * dim, hidden]: the index heads' queries, then one key
    q_norm: torch.Tensor  # [dim], zero-centred
    k_norm: torch.Tensor
    heads: int
    dim: int
    budget: int  # positions chosen from complete blocks at most
    block: int  # positions a pooled block covers
    eps: float


def select(w: IndexerWeights, x: torch.Tensor, span: Span, rows: PageRows, layer: str, rotary: Rotary,
           cos: torch.Tensor, sin: torch.Tensor) -> list[torch.Tensor]:
    """For each row of ``span``, the ascending positions it attends; stores index keys and blocks."""
    count = x.shape[0]
    projected = linear(x, w.qk)
    query = projected[:, :w.heads * w.dim].view(count, w.heads, w.dim)
    query = rotary.apply(zrms(query, w.q_norm, w.eps), cos, sin)
    positions = torch.arange(span.start, span.end, device=x.device)
    rows.write(f"{layer}.index", span.lane, positions, projected[:, w.heads * w.dim:])

    first, done = span.start // w.block, span.end // w.block
    if done > first:  # blocks this span completes
        raw = rows.read(f"{layer}.index", span.lane, done * w.block)[first * w.block:]
        pooled = raw.view(done - first, w.block, w.dim).float().mean(dim=1).to(x.dtype)
        starts = torch.arange(first, done, device=x.device) * w.block
        block_cos, block_sin = rotary.angles(starts, x.dtype)
        pooled = rotary.apply(zrms(pooled, w.k_norm, w.eps)[:, None, :], block_cos, block_sin)[:, 0]
        rows.write(f"{layer}.pooled", span.lane, torch.arange(first, done, device=x.device), pooled)
    blocks = rows.read(f"{layer}.pooled", span.lane, done).float()

    chosen = []
    most = w.budget // w.block
    for row in range(count):
        position = span.start + row
        complete = (position + 1) // w.block
        scores = torch.relu(query[row].float() @ blocks[:complete].T).sum(dim=0) / math.sqrt(w.dim)
        # A stable sort keeps the lower block first among equal scores.
        best = torch.sort(scores, descending=True, stable=True).indices[:most]
        picked = (best.sort().values[:, None] * w.block
                  + torch.arange(w.block, device=x.device)).flatten()
        tail = torch.arange(complete * w.block, position + 1, device=x.device)
        chosen.append(torch.cat((picked, tail)))
    return chosen

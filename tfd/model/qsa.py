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


def _index(w: IndexerWeights, x: torch.Tensor, span: Span, rows: PageRows, layer: str, rotary: Rotary,
           cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' index queries [count, heads, dim] and the lane's complete pooled blocks [done, dim]
    (fp32), after storing the rows' raw index keys and the blocks they complete."""
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
    return query, rows.read(f"{layer}.pooled", span.lane, done).float()


def select(w: IndexerWeights, x: torch.Tensor, span: Span, rows: PageRows, layer: str, rotary: Rotary,
           cos: torch.Tensor, sin: torch.Tensor) -> list[torch.Tensor]:
    """For each row of ``span``, the ascending positions it attends; stores index keys and blocks."""
    query, blocks = _index(w, x, span, rows, layer, rotary, cos, sin)
    chosen = []
    most = w.budget // w.block
    for row in range(x.shape[0]):
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


def select_positions(w: IndexerWeights, x: torch.Tensor, span: Span, rows: PageRows, layer: str,
                     rotary: Rotary, cos: torch.Tensor, sin: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``select`` for all rows at once, as ``kernels.sparse_attention`` reads it: positions int32
    [count, width] (each row's ascending positions first, then -1) and their counts int32 [count].
    Every step is per row: the scores' products by the batch-invariant GEMM, the heads' ReLUs added
    in head order, a stable sort; so a row's choice never depends on the other rows."""
    query, blocks = _index(w, x, span, rows, layer, rotary, cos, sin)
    count, done, device = x.shape[0], blocks.shape[0], x.device
    positions = torch.arange(span.start, span.end, device=device)
    complete = (positions + 1) // w.block
    never = span.end + w.block  # past every position: sorts last, then becomes -1
    if done:
        products = linear(query.float().reshape(count * w.heads, w.dim), blocks).view(count, w.heads, done)
        scores = torch.relu(products[:, 0])
        for head in range(1, w.heads):
            scores = scores + torch.relu(products[:, head])
        scores = scores / math.sqrt(w.dim)
        visible = torch.arange(done, device=device)[None, :] < complete[:, None]
        best = torch.sort(torch.where(visible, scores, float("-inf")), dim=-1, descending=True,
                          stable=True).indices[:, :w.budget // w.block]
        picked = (best[:, :, None] * w.block + torch.arange(w.block, device=device)).flatten(1)
        picked = torch.where((best < complete[:, None]).repeat_interleave(w.block, dim=1), picked, never)
    else:
        picked = torch.empty(count, 0, dtype=torch.long, device=device)
    tail = complete[:, None] * w.block + torch.arange(w.block - 1, device=device)
    tail = torch.where(tail <= positions[:, None], tail, never)
    ordered = torch.sort(torch.cat((picked, tail), dim=1), dim=1).values
    counts = (ordered < never).sum(dim=1)
    return torch.where(ordered < never, ordered, -1).to(torch.int32), counts.to(torch.int32)

"""Flash Next's gated residual streams (hyper-connections, reference/model.md 3.2).

The residual is ``streams`` stacked copies of width ``width``. A read normalises each stream, mixes
them with low-rank gates into the block input, and (for a layer's two modules, not the final
mixer) gives each stream's injection weight; the block output is then added to every stream with
its weight.
"""

from __future__ import annotations

import attrs
import torch

from tfd.model.ops import linear, sigmoid, silu, zrms


@attrs.frozen
class HyperWeights:
    norm: torch.Tensor  # [streams * width], zero-centred, per stream
    down: torch.Tensor  # [rank, streams * width]
    up: torch.Tensor  # [streams * width, rank]
    inject: torch.Tensor | None  # [streams, streams * width]; None for the final mixer
    streams: int
    width: int
    eps: float


def read(w: HyperWeights, stack: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The block input [rows, width] and the per-stream injection weights [rows, streams]."""
    normed = zrms(stack, w.norm, w.eps, group=w.width)
    mix = sigmoid(linear(silu(linear(normed, w.down) / w.streams), w.up))
    split = (w.streams, w.width)
    block_input = (torch.unflatten(mix, -1, split) * torch.unflatten(normed, -1, split)).mean(dim=-2)
    if w.inject is None:
        return block_input, None
    return block_input, 2 * sigmoid(linear(normed, w.inject) / w.streams)


def write(stack: torch.Tensor, output: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Add the block ``output`` [rows, width] to each stream, scaled by its weight."""
    return stack + (output[:, None, :] * weights[:, :, None]).flatten(-2)

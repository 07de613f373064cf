"""Flash Next's gated residual streams (hyper-connections, reference/model.md 3.2).

The residual is ``streams`` stacked copies of width ``width``. A read normalises each stream, mixes
them with low-rank gates into the block input, and (for a layer's two modules, not the final
mixer) gives each stream's injection weight; the block output is then added to every stream with
its weight. On CUDA the mix's down rows and the injection rows are one product and the steps
between the products are ``tfd_kernels.hyper``'s launches (the same cast points); elsewhere torch.
"""

from __future__ import annotations

import attrs
import torch

from tfd.model.fp8 import Joined, Weight
from tfd.model.ops import linear, sigmoid, silu, zrms
from tfd_kernels import hyper as hyper_kernels
from tfd_kernels import hyper_mix

# The read's down product asks for its first weights before it waits on the streams' norm (dependent launch,
# tfd_kernels.gemm's ``early``): timing alone, the same bits. Off until the H200 says (tfd bench --variant,
# tfd.model.hyper.DOWN_EARLY=1): 32 of these products a Flash Next step, 7.7 us each at one stream.
DOWN_EARLY = False


@attrs.frozen
class HyperWeights:
    norm: torch.Tensor  # [streams * width], zero-centred, per stream
    projections: Weight  # [rank (+ streams), streams * width]: the mix's down rows, the injection's
    up: Weight  # [streams * width, rank]
    streams: int
    width: int
    eps: float

    @property
    def rank(self) -> int:
        return int(self.up.shape[1])

    @property
    def injects(self) -> bool:
        """A layer's two modules weigh the streams they write back; the final mixer only reads."""
        return self.projections.shape[0] > self.rank


def read(w: HyperWeights, stack: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The block input [rows, width] and the per-stream injection weights [rows, streams]."""
    return _mixed(w, zrms(stack, w.norm, w.eps, group=w.width))


Pending = tuple[torch.Tensor, torch.Tensor]  # a block's output and its stream weights, not yet written


def read_after(w: HyperWeights, stack: torch.Tensor, pending: Pending | None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``read(w, ...)`` of ``stack`` once ``pending`` (None: nothing) is written into it: (the
    streams, the block input, the injection weights). On CUDA the write and the read's norm are one
    launch (``tfd_kernels.hyper.write_norm``), the same arithmetic as ``write`` then ``read``."""
    if pending is None:
        return (stack, *read(w, stack))
    if stack.is_cuda:
        written, normed = hyper_kernels.write_norm(stack, *pending, w.norm, w.eps)
        return (written, *_mixed(w, normed))
    written = write(stack, *pending)
    return (written, *read(w, written))


def _mixed(w: HyperWeights, normed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``read``'s block input and injection weights from the normalised streams."""
    if normed.is_cuda:
        projected = linear(normed, w.projections, early=DOWN_EARLY)
        # the gates, the up product and the mean at once (a float up weight: the kernel reads it)
        if not w.streams & (w.streams - 1) and isinstance(w.up, torch.Tensor):
            return hyper_mix.mix(projected, w.up, normed, w.streams, w.width)
        mixed, weights = hyper_kernels.gates(projected, w.rank, w.streams)
        return hyper_kernels.block_input(linear(mixed, w.up), normed, w.streams, w.width), weights
    down, inject = _down_and_inject(w)
    mix = sigmoid(linear(silu(linear(normed, down) / w.streams), w.up))
    split = (w.streams, w.width)
    block_input = (torch.unflatten(mix, -1, split) * torch.unflatten(normed, -1, split)).mean(dim=-2)
    if not w.injects:
        return block_input, None
    assert inject is not None
    return block_input, 2 * sigmoid(linear(normed, inject) / w.streams)


def _down_and_inject(w: HyperWeights) -> tuple[Weight, Weight | None]:
    """The mix's down rows and the injection's (None for the final mixer), each its own product."""
    if not w.injects:
        return w.projections, None
    if isinstance(w.projections, Joined):
        down, inject = w.projections.parts
        return down, inject
    assert isinstance(w.projections, torch.Tensor), "down and injection rows: one tensor or two joined parts"
    return w.projections[:w.rank], w.projections[w.rank:]


def write(stack: torch.Tensor, output: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Add the block ``output`` [rows, width] to each stream, scaled by its weight."""
    if stack.is_cuda:
        return hyper_kernels.write(stack, output, weights)
    return stack + (output[:, None, :] * weights[:, :, None]).flatten(-2)

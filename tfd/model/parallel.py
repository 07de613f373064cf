"""Tensor parallelism: one process a device, each holding a share of every layer's heads and inner
width, the blocks' partial outputs summed across them once a block.

A block whose weights are split by heads (attention, GDN) or by inner width (a dense MLP, the MoE's
experts and shared expert) gives each rank a partial output: the product of its heads' rows with its
columns of the out projection. ``Parallel.reduce`` sums them. It gathers every rank's partial and
adds them in rank order in fp32, rather than through the collective's own sum, whose order follows
the tensor's size and the ring's chunks: so a row's sum depends on that row alone (a lane's tokens
at a parallel size do not depend on its batch) and every rank holds the same bits (they take the same
decisions). Across parallel sizes the bits may differ: the products' sums run over other splits.

The gather is one collective into one buffer (``all_gather_single``), so a decode graph captures it
as one NCCL launch on CUDA. Over gloo (which gathers no CUDA tensors) a CUDA partial goes through the
host: ranks sharing one card, as the single-GPU tests run them, eagerly (no graphs: the copy waits).

Error handling: a collective that fails (a rank gone) raises what torch.distributed raises.
"""

from __future__ import annotations

import attrs
import torch
import torch.distributed as dist

# torch 2.13 renamed all_gather_into_tensor (the old name warns); the device's torch may predate it
_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@attrs.frozen
class Parallel:
    """This process is ``rank`` of ``size`` in ``group`` (torch.distributed's; None: the default), which
    carries the blocks' sums; ``control`` carries what the hosts agree on (plain objects, counts): a
    gloo group beside NCCL on CUDA, None where the default group is gloo already (the CPU)."""

    rank: int
    size: int
    group: dist.ProcessGroup | None = None
    experts: bool = False  # expert parallel: routed experts held whole, a share of them a rank
    control: dist.ProcessGroup | None = None

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} is not one of {self.size}")

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's ``partial`` (same shape and dtype on each), in rank order in fp32,
        returned in ``partial``'s dtype."""
        if self.size == 1:
            return partial
        if partial.is_cuda and dist.get_backend(self.group) == "gloo":  # ranks sharing one card (tests)
            return self.reduce(partial.cpu()).to(partial.device)
        gathered = partial.new_empty((self.size, *partial.shape))
        _gather(gathered.flatten(0, 1), partial.contiguous(), group=self.group)
        total = gathered[0].float()
        for part in gathered[1:]:
            total = total + part.float()
        return total.to(partial.dtype)

    def share(self, count: int) -> tuple[int, int]:
        """This rank's contiguous share of ``count`` units (heads, inner columns): (first, past last).
        ``ValueError`` when ``count`` does not split evenly."""
        if count % self.size:
            raise ValueError(f"{count} do not split into {self.size} equal shares")
        each = count // self.size
        return self.rank * each, (self.rank + 1) * each

"""CUDA graphs of the batched decode step, one per bucket of lane counts, replayed with new inputs.

The step is the runner's: the layers, the head and each lane's keyed draw into the feed row its
column names, so a plain decode step is one copy of its packed inputs to the device, one replay and
one copy of the drawn tokens back, on the runner's side stream (a step fed the last one's draw names
its rows in its token fields: nothing else moves between).

Capture happens once, at load: for each bucket (largest first, all sharing one memory pool) the
step runs once eagerly on a side stream, which compiles every Triton kernel, then is captured
with every lane a padding lane, reading the bucket's own input tensor. A replay copies the step's
columns and the bucket's padding columns from pinned host memory into that tensor in one copy, and
replays; the output rows of padding lanes are dropped. Because every kernel is batch-invariant and
a padding lane touches no memory, a replay gives the same bits as the eager step over the live lanes
alone.

Resource handling: the graphs, their pool and their outputs live as long as this object; an
output is only valid until the next ``run``.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Sequence

import torch

from tfd.model.decode import Columns, DecodeBatch

log = logging.getLogger("tfd.graphs")
Step = Callable[[DecodeBatch], tuple[torch.Tensor, ...]]  # a batch's outputs, each with a row a lane
BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def buckets_for(max_lanes: int) -> tuple[int, ...]:
    """The buckets up to ``max_lanes``, and ``max_lanes`` itself so every count has a graph."""
    return tuple(sorted({b for b in BUCKETS if b < max_lanes} | {max_lanes}))


class DecodeGraphs:
    def __init__(self, step: Step, columns: Columns, null_page: int,
                 max_lanes: int, device: torch.device) -> None:
        self.columns = columns
        self.buckets = buckets_for(max_lanes)
        self.padding = columns.padding(null_page)
        padding = torch.tensor(self.padding, dtype=torch.int64, device=device)[:, None]
        self.inputs = {bucket: padding.repeat(1, bucket) for bucket in self.buckets}  # each contiguous
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, ...]] = {}
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        for bucket in reversed(self.buckets):
            batch = DecodeBatch(self.inputs[bucket], columns)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                step(batch)  # compiles the kernels; padding lanes touch nothing
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bucket] = step(batch)
            self.graphs[bucket] = graph
        torch.cuda.synchronize(device)
        log.info("captured decode graphs for %s lanes", ", ".join(map(str, self.buckets)))

    def run(self, columns: Sequence[Sequence[int]]) -> tuple[torch.Tensor, ...]:
        """The step's outputs (each with a row a lane) for each lane's ``Columns.column``."""
        lanes = len(columns)
        bucket = self.buckets[bisect.bisect_left(self.buckets, lanes)]
        held = torch.tensor([*columns, *[self.padding] * (bucket - lanes)], dtype=torch.int64)
        # pinned, so the copy does not wait (the caching host allocator keeps it until the copy is done)
        self.inputs[bucket].copy_(held.T.contiguous().pin_memory(), non_blocking=True)
        self.graphs[bucket].replay()
        return tuple(output[:lanes] for output in self.outputs[bucket])

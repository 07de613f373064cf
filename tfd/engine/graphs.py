"""CUDA graphs of the batched decode step, one per bucket of lane counts, replayed with new inputs.

The step is the runner's: the layers, the head and each lane's keyed draw, so a plain decode step
is one replay and one copy of the drawn tokens back to the host.

Capture happens once, at load: for each bucket (largest first, all sharing one memory pool) the
step runs once eagerly on a side stream, which compiles every Triton kernel, then is captured
with every lane a padding lane. A replay copies the step's packed rows into the fixed input
tensor, fills the bucket's remaining rows with padding, and replays; the output rows of padding
lanes are dropped. Because every kernel is batch-invariant and a padding lane touches no memory,
a replay gives the same bits as the eager step over the live lanes alone.

Resource handling: the graphs, their pool and their outputs live as long as this object; an
output is only valid until the next ``run``.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable

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
        self.padding = torch.tensor(columns.padding(null_page), dtype=torch.int64, device=device)[:, None]
        self.inputs = self.padding.repeat(1, self.buckets[-1])
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, ...]] = {}
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        for bucket in reversed(self.buckets):
            batch = DecodeBatch(self.inputs[:, :bucket], columns)
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

    def run(self, packed: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The step's outputs (each with a row a lane) for ``packed`` [width, lanes]
        (``DecodeBatch.packed``)."""
        lanes = packed.shape[1]
        bucket = self.buckets[bisect.bisect_left(self.buckets, lanes)]
        self.inputs[:, :lanes].copy_(packed, non_blocking=True)
        if bucket > lanes:
            self.inputs[:, lanes:bucket].copy_(self.padding.expand(-1, bucket - lanes))
        self.graphs[bucket].replay()
        return tuple(output[:lanes] for output in self.outputs[bucket])

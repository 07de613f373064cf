"""CUDA graphs of the batched decode step and of verify rounds, one per bucket of lane counts,
replayed with new inputs.

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

A step whose lanes draw on the host's path but for a grammar's mask is drawn again over the same
rows with the masks (``DecodePipeline.drawn_on_host``): with ``redraw`` given, that draw is captured
too, a graph a bucket reading the bucket's step outputs and inputs and one mask buffer, so the draw
costs the host one copy of the masks and one replay, not the launches of an eager draw (~300 us a
step on the H100's host, more than the demo's whole step).

A verify round (``tfd.engine.rounds``) is captured the same way, a graph per bucket with every
lane's window ``width`` rows wide: its inputs are the rows' columns and the lanes' verify offsets,
its output the round's draws, kept counts and next drafts; narrower windows are padded with padding
rows, and the bucket's lanes past the live ones are padding lanes.

Resource handling: the graphs, their pool and their outputs live as long as this object; an
output is only valid until the next ``run``.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from tfd.engine.round_step import RoundInputs, host_inputs
from tfd.model.decode_batch import Columns, DecodeBatch

log = logging.getLogger("tfd.graphs")
Step = Callable[[DecodeBatch], tuple[torch.Tensor, ...]]  # a batch's outputs, each with a row a lane
# a batch, the outputs its step gave and each row's mask: the step's draw again, masked
Redraw = Callable[[DecodeBatch, tuple[torch.Tensor, ...], torch.Tensor], object]
T = TypeVar("T")
RoundStep = Callable[[RoundInputs], torch.Tensor]  # a round's output, a row a lane
BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def buckets_for(max_lanes: int) -> tuple[int, ...]:
    """The buckets up to ``max_lanes``, and ``max_lanes`` itself so every count has a graph."""
    return tuple(sorted({b for b in BUCKETS if b < max_lanes} | {max_lanes}))


def _capture(run: Callable[[], T], pool: Any, device: torch.device) -> tuple[torch.cuda.CUDAGraph, T]:
    """``run`` once eagerly on a side stream (compiling every kernel), then captured into ``pool``:
    the graph and what the captured run returned."""
    side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # under tensor parallel NCCL's watchdog thread queries events while this thread captures: in the
    # default (global) mode a call from any thread would end the capture
    mode = "thread_local" if dist.is_initialized() else "global"
    with torch.cuda.graph(graph, pool=pool, capture_error_mode=mode):
        outputs = run()
    return graph, outputs


class DecodeGraphs:
    """Decode steps of ``step`` for up to ``max_lanes`` lanes; with ``redraw``, its masked draw
    again, reading masks of ``words`` int32 words a row (``grammar_masks.allowed``'s)."""

    def __init__(self, step: Step, columns: Columns, null_page: int, max_lanes: int, device: torch.device,
                 redraw: Redraw | None = None, words: int = 0) -> None:
        self.columns = columns
        self.buckets = buckets_for(max_lanes)
        self.padding = np.array(columns.padding(null_page), dtype=np.int64)  # a padding lane's fields
        padding = torch.from_numpy(self.padding).to(device)[:, None]
        self.inputs = {bucket: padding.repeat(1, bucket) for bucket in self.buckets}  # each contiguous
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, ...]] = {}
        self.redraws: dict[int, torch.cuda.CUDAGraph] = {}
        # a bucket's redraw reads its first rows; a padding lane's row draws nowhere, whatever its mask
        self.masks = torch.full((self.buckets[-1], words), -1, dtype=torch.int32, device=device)
        pool = torch.cuda.graph_pool_handle()
        for bucket in reversed(self.buckets):
            batch = DecodeBatch(self.inputs[bucket], columns)
            self.graphs[bucket], self.outputs[bucket] = _capture(partial(step, batch), pool, device)
            if redraw is not None:
                masks = self.masks[:bucket]
                self.redraws[bucket], _ = _capture(partial(redraw, batch, self.outputs[bucket], masks), pool,
                                                   device)
        torch.cuda.synchronize(device)
        log.info("captured decode graphs for %s lanes%s", ", ".join(map(str, self.buckets)),
                 " and their masked draws" if redraw is not None else "")

    def bucket(self, lanes: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, lanes)]

    def pack(self, heads: Sequence[Sequence[int]], tails: Sequence[np.ndarray]) -> torch.Tensor:
        """A replay's inputs for each lane's ``Columns.head`` and ``Columns.tail``, its bucket's padding
        lanes after them, in pinned host memory (the caching host allocator keeps it until the copy
        that reads it is done, so the copy does not wait): made on the host ahead of the replay."""
        return self.columns.pack(heads, tails, pinned=True, padded_to=self.bucket(len(heads)),
                                 padding=self.padding)

    def run(self, lanes: int, packed: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], DecodeBatch]:
        """The step's outputs (each with a row a lane) for ``lanes`` lanes' inputs ``packed``
        (``pack``'s), and its live lanes' inputs on the device (both valid until the bucket's next
        replay)."""
        bucket = self.bucket(lanes)
        self.inputs[bucket].copy_(packed, non_blocking=True)
        self.graphs[bucket].replay()
        return (tuple(output[:lanes] for output in self.outputs[bucket]),
                DecodeBatch(self.inputs[bucket][:, :lanes], self.columns))

    def redraw(self, masks: torch.Tensor) -> None:
        """The last replay's draw again over its ``masks.shape[0]`` live lanes with ``masks`` (pinned
        host [lanes, words], copied without waiting: the caller keeps them until the step's tokens
        are back), into the feed rows the step drew into. Only right after that replay: the graph
        reads the bucket's outputs and inputs, which the bucket's next replay overwrites."""
        lanes = masks.shape[0]
        self.masks[:lanes].copy_(masks, non_blocking=True)
        self.redraws[self.bucket(lanes)].replay()


class RoundGraphs:
    """Verify rounds of ``step`` for up to ``max_lanes`` lanes of ``width`` rows each; ``lane_padding``
    is a padding lane's verify offsets; page tables ``pages`` wide."""

    def __init__(self, step: RoundStep, columns: Columns, null_page: int, lane_padding: list[int],
                 max_lanes: int, width: int, pages: int, device: torch.device) -> None:
        self.width = width
        self.buckets = buckets_for(max_lanes)
        self.padding = columns.padding(null_page)
        self.lane_padding = lane_padding
        self.empty_table = [null_page] * pages
        self.inputs: dict[int, RoundInputs] = {}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        pool = torch.cuda.graph_pool_handle()
        for bucket in reversed(self.buckets):
            held = self.padded([], [], [], [], bucket)
            self.inputs[bucket] = RoundInputs(*(value.to(device) for value in held))
            captured = _capture(partial(step, self.inputs[bucket]), pool, device)
            self.graphs[bucket], self.outputs[bucket] = captured
        torch.cuda.synchronize(device)
        log.info("captured verify round graphs for %s lanes of %d rows", ", ".join(map(str, self.buckets)),
                 width)

    def bucket(self, lanes: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, lanes)]

    def padded(self, columns: Sequence[Sequence[int]] | None, offsets: Sequence[Sequence[int]] | None,
               tables: Sequence[Sequence[int]], limits: Sequence[int], bucket: int) -> list[torch.Tensor]:
        """Host inputs (``host_inputs``) for ``bucket`` lanes: the live lanes' then padding lanes'."""
        spare = bucket - len(limits)
        return host_inputs(None if columns is None else [*columns, *[self.padding] * (spare * self.width)],
                           None if offsets is None else [*offsets, *[self.lane_padding] * spare],
                           [*tables, *[self.empty_table] * spare], [*limits, *[0] * spare])

    def run(self, lanes: int, held: Sequence[torch.Tensor]) -> torch.Tensor:
        """Replay the round for ``lanes`` lanes, ``held`` (``padded``) copied into its inputs first: all
        of them, or only the page tables and limits for a round run ahead on the inputs the bucket's
        last replay advanced to. The output, a row a lane (valid until the bucket's next replay)."""
        bucket = self.bucket(lanes)
        self.inputs[bucket].copy_(held)
        self.graphs[bucket].replay()
        return self.outputs[bucket][:lanes]

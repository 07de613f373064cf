"""Pinned host memory that small host-made tensors (page ids, a step's fields, a prompt's token ids)
go through on their way to the device, made once a device.

Such a tensor is copied from the host behind the device's queued work, so from pinned memory. torch's
pinned blocks come from a cache that a CUDA graph capture empties (``torch.cuda.graph`` calls
``torch._C._host_emptyCache``), so the first copies after a capture (every run of ``tfd bench``,
which captures its decode graphs a run) allocated pinned memory anew: ``cudaHostAlloc``, 0.9-1.9 ms
of a prefill step on the H100's host. ``HostStaging`` holds one pinned buffer for its life and uses
it as a ring of bytes: each copy takes the next run (16-byte aligned), copies from it without
waiting and records an event after the copy; a run is handed out again only once the copy that read
it has run (its event waited for, a lap of the ring later: long done). A tensor larger than the ring
goes through torch's pinned cache as before. A copy is never captured into a graph (a replay would
read the run again, long after it was handed out anew): asked for while the current stream captures,
it raises. ``ring_for`` gives a device's ring, shared by the pool's page tables and
``tfd.model.memory.to_device``. Thread-safe (a lock a ring); a copy is queued on the calling thread's
current stream.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

import numpy as np
import torch

RING_BYTES = 1 << 22  # 4 MiB: a 32,768-row prompt's token ids are 256 KB, a 32-lane step's fields ~140 KB
ALIGN = 16  # each run starts on a 16-byte boundary: any element type views it
_RINGS: dict[int, HostStaging] = {}
_RINGS_LOCK = threading.Lock()


def ring_for(device: torch.device) -> HostStaging:
    """The ring of CUDA ``device`` (made on first use and kept for the process's life)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _RINGS_LOCK:
        ring = _RINGS.get(index)
        if ring is None:
            ring = _RINGS[index] = HostStaging()
        return ring


def _not_captured() -> None:
    """Raise RuntimeError if the current stream is capturing a CUDA graph."""
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("a host tensor's copy through the staging ring cannot be captured into a CUDA "
                           "graph: a replay would read ring memory handed out anew since")


def _check_ids(dest: torch.Tensor, count: int) -> None:
    """ValueError naming ``dest`` unless it is an int32 CUDA tensor of ``count`` ids, one dimension."""
    if dest.shape != (count,) or dest.dtype != torch.int32 or not dest.is_cuda:
        raise ValueError(f"dest is {dest.dtype} {list(dest.shape)} on {dest.device}, expected "
                         f"int32 [{count}] on a CUDA device")


class HostStaging:
    """``size`` bytes of pinned host memory, copied to CUDA tensors as a ring."""

    def __init__(self, size: int = RING_BYTES) -> None:
        if size < ALIGN:
            raise ValueError(f"a staging ring needs at least {ALIGN} bytes, got {size}")
        self.host = torch.empty(size - size % ALIGN, dtype=torch.uint8, pin_memory=True)
        self.at = 0  # where the next run begins, in bytes
        # runs whose copies may not have run yet, oldest first: (first byte, end, event after the copy)
        self.reading: deque[tuple[int, int, torch.cuda.Event]] = deque()
        self.lock = threading.Lock()

    def write(self, dest: torch.Tensor, values: Sequence[int] | np.ndarray) -> None:
        """``values`` into ``dest`` (a contiguous int32 CUDA tensor of as many entries), the copy
        queued on the current stream behind its work; the host does not wait for it. Raises
        ``ValueError`` for a ``dest`` of another size or dtype, RuntimeError while a graph captures."""
        _check_ids(dest, len(values))
        self.put(torch.from_numpy(np.asarray(values, dtype=np.int32)), dest)

    def write_many(self, items: Sequence[tuple[torch.Tensor, np.ndarray]]) -> None:
        """Each item's ``values`` into its ``dest`` (as ``write``), in one copy to the device and one device
        copy into them all (``torch._foreach_copy_``): a step's lanes taking pages one after another left
        the device idle between their copies (the 35B-A3B's 8 x 1,024 prefill step: 8 gaps, 0.76 ms on the
        H100). Raises ``ValueError`` naming a ``dest`` of another size or dtype."""
        for dest, values in items:
            _check_ids(dest, len(values))
        if not items:
            return
        joined = np.concatenate([np.asarray(values, dtype=np.int32) for _, values in items])
        scratch = torch.empty(len(joined), dtype=torch.int32, device=items[0][0].device)
        self.put(torch.from_numpy(joined), scratch)
        parts = torch.split(scratch, [len(values) for _, values in items])
        torch._foreach_copy_([dest for dest, _ in items], list(parts))

    def put(self, held: torch.Tensor, dest: torch.Tensor) -> None:
        """Host tensor ``held`` into ``dest`` (a contiguous CUDA tensor of its dtype and shape), the copy
        queued on the current stream behind its work; the host does not wait for it, and ``held`` may be
        changed or freed on return. Raises ``ValueError`` naming ``held`` or ``dest`` where they do not
        match, RuntimeError while a graph captures."""
        if held.is_cuda:
            raise ValueError(f"held must be a host tensor, it is on {held.device}")
        fits = dest.shape == held.shape and dest.dtype == held.dtype and dest.is_contiguous()
        if not (fits and dest.is_cuda):
            raise ValueError(f"dest is {dest.dtype} {list(dest.shape)} on {dest.device}, expected a "
                             f"contiguous {held.dtype} {list(held.shape)} on a CUDA device")
        size = held.numel() * held.element_size()
        if size == 0:
            return
        _not_captured()
        if size > self.host.numel():
            dest.copy_(held.pin_memory(), non_blocking=True)
            return
        with self.lock:
            start = self._take(size)
            self.host[start:start + size].view(held.dtype).view(held.shape).copy_(held)
            self._copy(dest, start, size)

    def _take(self, size: int) -> int:
        """The first byte of a free run of ``size`` bytes (at most the ring's), waiting for the copies
        that still read it; the ring moves past it."""
        start = self.at if self.at + size <= self.host.numel() else 0
        self._free(start, start + size)
        self.at = min(self.host.numel(), -(-(start + size) // ALIGN) * ALIGN)
        return start

    def _copy(self, dest: torch.Tensor, start: int, size: int) -> None:
        """Bytes ``start .. start + size`` of the ring into ``dest``, queued; the run is read until its
        event has run."""
        dest.view(-1).view(torch.uint8).copy_(self.host[start:start + size], non_blocking=True)
        copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
        copied.record(torch.cuda.current_stream(dest.device))
        self.reading.append((start, start + size, copied))

    def _free(self, start: int, end: int) -> None:
        """Wait until no copy still to run reads bytes ``start .. end``; forget the runs done."""
        while self.reading and self.reading[0][2].query():  # type: ignore[no-untyped-call]
            self.reading.popleft()
        kept: deque[tuple[int, int, torch.cuda.Event]] = deque()
        for first, last, copied in self.reading:
            if first < end and start < last:
                copied.synchronize()
            else:
                kept.append((first, last, copied))
        self.reading = kept

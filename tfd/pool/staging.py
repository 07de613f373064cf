"""Pinned host memory that the lanes' page ids go through on their way to the device, made once.

A lane's page table on the device is written from the host as its pages are taken, behind the device's
queued work, so from pinned memory. torch's pinned blocks come from a cache that a CUDA graph capture
empties, so the first writes after a capture (every run of ``tfd bench``, which captures its decode
graphs a run) allocated pinned memory anew: ``cudaHostAlloc``, 0.9-1.9 ms of a prefill step on the
H100's host. ``HostStaging`` holds one pinned buffer for the pool's life and uses it as a ring: each
write takes the next run of entries, copies from it without waiting and records an event after the
copy; a run is handed out again only once the copy that read it has run (its event waited for, a lap
of the ring later: long done). A write longer than the ring goes through torch's pinned cache as
before. Engine thread only (the pool's leases are).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch

RING_ENTRIES = 1 << 16  # 256 KB of int32 page ids: a 32k window of 64-row pages is 512


class HostStaging:
    """``entries`` int32 values of pinned host memory, written to CUDA tensors as a ring."""

    def __init__(self, entries: int = RING_ENTRIES) -> None:
        if entries <= 0:
            raise ValueError(f"a staging ring needs at least one entry, got {entries}")
        self.host = torch.empty(entries, dtype=torch.int32, pin_memory=True)
        self.values = self.host.numpy()
        self.at = 0  # where the next run begins
        # runs whose copies may not have run yet, oldest first: (first entry, end, event after the copy)
        self.reading: deque[tuple[int, int, torch.cuda.Event]] = deque()

    def write(self, dest: torch.Tensor, values: Sequence[int]) -> None:
        """``values`` into ``dest`` (a contiguous int32 CUDA tensor of as many entries), the copy
        queued on the current stream behind its work; the host does not wait for it. Raises
        ``ValueError`` for a ``dest`` of another size or dtype."""
        count = len(values)
        if dest.shape != (count,) or dest.dtype != torch.int32 or not dest.is_cuda:
            raise ValueError(f"dest is {dest.dtype} {list(dest.shape)} on {dest.device}, expected "
                             f"int32 [{count}] on a CUDA device")
        if count == 0:
            return
        if count > len(self.values):
            dest.copy_(torch.tensor(values, dtype=torch.int32).pin_memory(), non_blocking=True)
            return
        start = self.at if self.at + count <= len(self.values) else 0
        end = start + count
        self._free(start, end)
        self.values[start:end] = values
        dest.copy_(self.host[start:end], non_blocking=True)
        copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
        copied.record(torch.cuda.current_stream(dest.device))
        self.reading.append((start, end, copied))
        self.at = end

    def _free(self, start: int, end: int) -> None:
        """Wait until no copy still to run reads entries ``start .. end``; forget the runs done."""
        while self.reading and self.reading[0][2].query():  # type: ignore[no-untyped-call]
            self.reading.popleft()
        kept: deque[tuple[int, int, torch.cuda.Event]] = deque()
        for first, last, copied in self.reading:
            if first < end and start < last:
                copied.synchronize()
            else:
                kept.append((first, last, copied))
        self.reading = kept

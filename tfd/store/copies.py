"""Copies between the device and the host through pinned staging buffers, for the disk store.

``Copier.save`` takes device byte ranges as one stream of bytes cut into windows of ``chunk`` bytes:
each window is gathered on the device into a staging buffer of its own (one launch however many
ranges it spans: a 30,000-token state's rows are thousands of ranges), summed there
(``tfd.store.checksum``, keyed from the window's first word) and copied out once to a pinned host
buffer, whose bytes go to a sink (the file writer) in order. Two windows take turns, so the device
gathers and copies one while the host drains the other. Everything runs on the device's own
stream, queued without waiting; a buffer is reused only after the work that used it is done.
(A state read back is one copy a file into one device buffer: ``tfd.cache.learned``, against the
same ``Device``.)

Error handling: whatever raises (a refused copy, a sink or source that fails, a cancel), everything
queued is waited for before the call returns or raises (a ``Copier``), or before the buffers and the
stream it used are released (a ``Drain``), so no copy is left in flight into or out of a buffer the
caller may then free or reuse. The layer speaks to a ``Device``: ``TorchDevice`` on a
real one (a CUDA stream of its own, or plain copies on the CPU), a fake in tests that queues the
work and refuses the Nth copy.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs
import torch

from tfd.store.checksum import halves, joined

CHUNK_BYTES = 32 << 20  # a staging buffer


class Device(Protocol):
    """What the copy layer needs of a device: pinned host buffers, copies queued on a stream of its
    own, marks after what is queued, and waits for them."""

    def pinned(self, nbytes: int) -> torch.Tensor:
        """A host byte buffer the device copies to and from."""

    def buffer(self, nbytes: int) -> torch.Tensor:
        """A device byte buffer."""

    def gather(self, sources: Sequence[torch.Tensor], target: torch.Tensor) -> None:
        """Queue a copy of device bytes ``sources``, one after another, into device bytes ``target``."""

    def word_sum(self, data: torch.Tensor, first_word: int) -> Callable[[], int]:
        """Queue the word sum of device bytes ``data`` keyed from ``first_word``; what it gives once
        the work before a later mark is waited for."""

    def to_host(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """Queue a copy of device bytes ``source`` into host bytes ``target``."""

    def to_device(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """Queue a copy of host bytes ``source`` into device bytes ``target``."""

    def streamed(self) -> contextlib.AbstractContextManager[object]:
        """Within it, the calling thread's device work goes to this device's stream (a buffer made, a
        sum, a scatter of what was copied in)."""

    def now(self) -> object:
        """A mark after the compute stream's work queued so far (``begin``'s ``after``)."""

    def begin(self, after: object = None) -> None:
        """The copies queued next see the device's work queued before (the state they read), or
        only the work before ``after`` (an event of the device's) when given."""

    def end(self) -> None:
        """The device's work queued next sees the copies queued before (the state they wrote)."""

    def join(self, mark: object) -> None:
        """The compute stream's work queued next sees the copies before ``mark`` (any device's); the
        host does not wait."""

    def mark(self) -> object:
        """A mark after every copy queued so far."""

    def wait(self, mark: object) -> None:
        """Return once the copies before ``mark`` are done."""

    def drain(self) -> None:
        """Return once every copy queued is done."""


class TorchDevice:
    """A torch device: on CUDA a stream of its own (its copies start after the work queued on the
    compute stream, and the compute stream waits for loads), pinned buffers; on the CPU plain
    copies, done when queued."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None  # type: ignore[no-untyped-call]

    def pinned(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.stream is not None)

    def buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def gather(self, sources: Sequence[torch.Tensor], target: torch.Tensor) -> None:
        with self._on_stream():
            torch.cat(list(sources), out=target)

    def word_sum(self, data: torch.Tensor, first_word: int) -> Callable[[], int]:
        with self._on_stream():
            high, low = halves(data, first_word)
        return lambda: joined(high, low)

    def streamed(self) -> contextlib.AbstractContextManager[object]:
        return self._on_stream()

    def now(self) -> object:
        if self.stream is None:
            return None
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(self.device))
        return event

    def _on_stream(self) -> contextlib.AbstractContextManager[object]:
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def begin(self, after: object = None) -> None:
        """The copies queued next see every step queued on the compute stream before, or the
        work before ``after`` (a CUDA event) when given."""
        if self.stream is None:
            return
        if isinstance(after, torch.cuda.Event):
            self.stream.wait_event(after)
        else:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def end(self) -> None:
        """The compute stream's next work sees every copy queued before."""
        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)

    def join(self, mark: object) -> None:
        if isinstance(mark, torch.cuda.Event):
            torch.cuda.current_stream(self.device).wait_event(mark)

    def to_host(self, source: torch.Tensor, target: torch.Tensor) -> None:
        self._copy(source, target)

    def to_device(self, source: torch.Tensor, target: torch.Tensor) -> None:
        self._copy(source, target)

    def _copy(self, source: torch.Tensor, target: torch.Tensor) -> None:
        if self.stream is None:
            target.copy_(source)
            return
        with torch.cuda.stream(self.stream):
            target.copy_(source, non_blocking=True)

    def mark(self) -> object:
        if self.stream is None:
            return None
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(self.stream)
        return event

    def wait(self, mark: object) -> None:
        if isinstance(mark, torch.cuda.Event):
            mark.synchronize()

    def drain(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()


@attrs.frozen
class Drain:
    """Copies still queued on a lent ``device`` up to ``mark``, and ``release``, which gives back what
    they use (the stream, staging buffers) once they are done. The owner of the copies hands it to
    whoever awaits it (``Learned``'s ``drains``: the trio loop in the daemon)."""

    device: Device
    mark: object
    release: Callable[[], None]

    def wait_and_release(self) -> None:
        """Wait for the copies (on this thread: never the engine's), then release, even when the wait
        raised: the device is then broken, and nothing of it may stay held."""
        try:
            self.device.wait(self.mark)
        finally:
            self.release()


class Streams:
    """Copy devices, each a stream of its own, made once (by the daemon's trio side at start, for its
    life) and lent to one lane's copies at a time; a device goes back drained, so the next lane's
    copies never wait on another's. Thread-safe: lent on a restore thread, given back by whatever
    awaited its copies."""

    def __init__(self, make: Callable[[], Device], count: int) -> None:
        if count < 1:
            raise ValueError(f"a lane's copies need a stream: count must be at least 1, not {count}")
        self.free = [make() for _ in range(count)]
        self.changed = threading.Condition()

    def lend(self) -> Device:
        """A free device, once one is (the caller's thread waits)."""
        with self.changed:
            self.changed.wait_for(lambda: bool(self.free))
            return self.free.pop()

    def give_back(self, device: Device) -> None:
        """``device`` free again, once every copy queued on it is done; free even when that wait raises
        (the device is broken, and what waits to lend one must not wait forever), which goes through."""
        try:
            device.drain()
        finally:
            with self.changed:
                self.free.append(device)
                self.changed.notify()


def host_bytes(buffer: torch.Tensor) -> memoryview:
    """A writable view of a contiguous host byte tensor's memory (no numpy needed), which keeps the
    tensor alive as long as the view is: a view of a temporary (``part.cpu()``) read freed memory, which
    the allocator had handed out again or written its own pointers into (the identity probe's digest
    moved from one daemon start to the next on the GPU)."""
    if buffer.device.type != "cpu" or buffer.dtype != torch.uint8 or not buffer.is_contiguous():
        raise TypeError(f"host_bytes takes contiguous uint8 host bytes, not {buffer.dtype} on "
                        f"{buffer.device}")
    memory = (ctypes.c_char * buffer.numel()).from_address(buffer.data_ptr())
    memory.owner = buffer  # type: ignore[attr-defined]  # the view holds the array, the array the tensor
    return memoryview(memory).cast("B")


def windows(ranges: Sequence[torch.Tensor], chunk: int) -> list[list[torch.Tensor]]:
    """The ranges (flat bytes) as one stream cut into windows of ``chunk`` bytes (the last shorter),
    each the list of range slices it holds, in order."""
    cut: list[list[torch.Tensor]] = [[]]
    room = chunk
    for whole in ranges:
        flat = whole.reshape(-1)
        if flat.dtype != torch.uint8:
            raise TypeError(f"copies move bytes: a range is {flat.dtype}, not uint8")
        at = 0
        while at < flat.numel():
            if not room:
                cut.append([])
                room = chunk
            take = min(room, flat.numel() - at)
            cut[-1].append(flat[at:at + take])
            at, room = at + take, room - take
    return [window for window in cut if window]


class Copier:
    """Copies out through two windows of ``chunk`` bytes (a multiple of 4) on ``device``."""

    def __init__(self, device: Device, chunk: int = CHUNK_BYTES) -> None:
        if chunk <= 0 or chunk % 4:
            raise ValueError(f"a window is a positive multiple of 4 bytes, not {chunk}")
        self.device = device
        self.chunk = chunk
        self.buffers = [device.pinned(chunk), device.pinned(chunk)]
        self.gathered = [device.buffer(chunk), device.buffer(chunk)]

    def save(self, ranges: Sequence[torch.Tensor], sink: Callable[[memoryview], None],
             after: object = None) -> int:
        """Copy the device ``ranges`` out and give ``sink`` their bytes in order (it must be done with
        a view when it returns); ``after``: the device's mark they wait for (else all work queued
        before). Their word sum (as one payload), summed on the device."""
        cut = windows(ranges, self.chunk)
        marks: list[object] = [None, None]
        sums: list[Callable[[], int]] = []
        self.device.begin(after)
        try:
            if cut:
                self._out(cut[0], 0, marks, sums)
            for i, window in enumerate(cut):
                if i + 1 < len(cut):  # the next window is gathered and copied while the host takes this one
                    self._out(cut[i + 1], (i + 1) % 2, marks, sums)
                self.device.wait(marks[i % 2])
                sink(host_bytes(self.buffers[i % 2][:sum(piece.numel() for piece in window)]))
        finally:
            self.device.drain()
        return sum(total() for total in sums)

    def _out(self, window: list[torch.Tensor], slot: int, marks: list[object],
             sums: list[Callable[[], int]]) -> None:
        size = sum(piece.numel() for piece in window)
        gathered = self.gathered[slot][:size]
        self.device.gather(window, gathered)
        sums.append(self.device.word_sum(gathered, len(sums) * self.chunk // 4))
        self.device.to_host(gathered, self.buffers[slot][:size])
        marks[slot] = self.device.mark()

"""The copy layer: bytes go out and back through two staging buffers, and on every error path (a
refused copy, a failing sink or source) nothing is left pending on the device when the call returns.

The fake device queues copies and runs them only when waited for, drained, or when a mark before them
is waited for, so a staging buffer reused too early would copy the wrong bytes; it refuses the Nth copy.
"""

from __future__ import annotations

import pytest
import torch

from tfd.store.copies import Copier, TorchDevice


class FakeDevice:
    """Copies queued, done only when waited for; copy number ``refuse`` (from 1) raises."""

    def __init__(self, refuse: int | None = None) -> None:
        self.refuse = refuse
        self.queued: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.done = 0  # copies run, in queue order
        self.count = 0
        self.began = self.ended = 0

    def pinned(self, nbytes: int) -> torch.Tensor:
        return torch.zeros(nbytes, dtype=torch.uint8)

    def begin(self, after: object = None) -> None:
        self.began += 1

    def end(self) -> None:
        self.ended += 1

    def to_host(self, source: torch.Tensor, target: torch.Tensor) -> None:
        self._queue(source, target)

    def to_device(self, source: torch.Tensor, target: torch.Tensor) -> None:
        self._queue(source, target)

    def _queue(self, source: torch.Tensor, target: torch.Tensor) -> None:
        self.count += 1
        if self.count == self.refuse:
            raise RuntimeError(f"copy {self.count} refused")
        self.queued.append((source, target))

    def mark(self) -> object:
        return len(self.queued)

    def wait(self, mark: object) -> None:
        assert isinstance(mark, int)
        while self.done < mark:
            source, target = self.queued[self.done]
            target.copy_(source)
            self.done += 1

    def drain(self) -> None:
        self.wait(len(self.queued))

    @property
    def pending(self) -> int:
        return len(self.queued) - self.done


def ranges() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(0, 256, (size,), generator=generator, dtype=torch.uint8)
            for size in (250, 7, 0, 301)]


def saved(copier: Copier, parts: list[torch.Tensor], fail_at: int | None = None) -> bytes:
    out = bytearray()

    def sink(view: memoryview) -> None:
        if fail_at is not None and len(out) >= fail_at:
            raise OSError("disk full")
        out.extend(view)

    copier.save(parts, sink)
    return bytes(out)


def loaded(copier: Copier, data: bytes, targets: list[torch.Tensor], fail_at: int | None = None) -> None:
    at = 0

    def source(view: memoryview) -> None:
        nonlocal at
        if fail_at is not None and at >= fail_at:
            raise OSError("short read")
        view[:] = data[at:at + len(view)]
        at += len(view)

    copier.load(source, targets)


def test_bytes_go_out_and_back_in_order() -> None:
    device = FakeDevice()
    copier = Copier(device, chunk=64)
    parts = ranges()
    data = saved(copier, parts)
    assert data == b"".join(part.numpy().tobytes() for part in parts)
    targets = [torch.zeros_like(part) for part in parts]
    loaded(copier, data, targets)
    assert all(torch.equal(a, b) for a, b in zip(targets, parts, strict=True))
    assert device.pending == 0 and device.began == device.ended == 1


def test_the_cpu_device_copies_the_same_bytes() -> None:
    copier = Copier(TorchDevice(torch.device("cpu")), chunk=100)
    parts = ranges()
    targets = [torch.zeros_like(part) for part in parts]
    loaded(copier, saved(copier, parts), targets)
    assert all(torch.equal(a, b) for a, b in zip(targets, parts, strict=True))


COPIES = 10  # pieces of at most 64 bytes: 4 (250 bytes) + 1 (7) + 0 (0) + 5 (301)


@pytest.mark.parametrize("refuse", range(1, COPIES + 1))
def test_a_refused_copy_leaves_nothing_pending(refuse: int) -> None:
    parts = ranges()
    out = FakeDevice(refuse)
    with pytest.raises(RuntimeError, match=f"copy {refuse} refused"):
        saved(Copier(out, chunk=64), parts)
    assert out.pending == 0, f"expected 0, found {out.pending}"
    back = FakeDevice(refuse)
    with pytest.raises(RuntimeError, match=f"copy {refuse} refused"):
        loaded(Copier(back, chunk=64), b"".join(p.numpy().tobytes() for p in parts),
               [torch.zeros_like(p) for p in parts])
    assert back.pending == 0, f"expected 0, found {back.pending}"


@pytest.mark.parametrize("fail_at", [0, 64, 300, 500])
def test_a_failing_sink_or_source_leaves_nothing_pending(fail_at: int) -> None:
    parts = ranges()
    out = FakeDevice()
    with pytest.raises(OSError, match="disk full"):
        saved(Copier(out, chunk=64), parts, fail_at)
    assert out.pending == 0, f"expected 0, found {out.pending}"
    back = FakeDevice()
    with pytest.raises(OSError, match="short read"):
        loaded(Copier(back, chunk=64), bytes(600), [torch.zeros_like(p) for p in parts], fail_at)
    assert back.pending == 0, f"expected 0, found {back.pending}"


def test_the_drain_is_what_empties_the_queue_on_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # a copier that skipped its drain on the error path would leave the copy it queued pending
    monkeypatch.setattr(FakeDevice, "drain", lambda self: None)
    device = FakeDevice(refuse=3)
    with pytest.raises(RuntimeError):
        saved(Copier(device, chunk=64), ranges())
    assert device.pending == 1

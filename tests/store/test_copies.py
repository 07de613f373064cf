"""The copy layer: bytes go out through two staging buffers in order, and on every error path (a
refused copy, a failing sink) nothing is left pending on the device when the call returns; a state
read back from the store is one copy, drained whether it fails or not.

The fake device (``fake_device``) runs a copy only when it is waited for, so a staging buffer reused
too early would copy the wrong bytes; it refuses the Nth copy.
"""

from __future__ import annotations

import pytest
import torch
from fake_device import FakeDevice

from tfd.store.copies import Copier, TorchDevice


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


def test_bytes_go_out_in_order() -> None:
    device = FakeDevice()
    parts = ranges()
    assert saved(Copier(device, chunk=64), parts) == b"".join(part.numpy().tobytes() for part in parts)
    assert device.pending == 0 and device.began == 1


def test_the_cpu_device_copies_the_same_bytes() -> None:
    parts = ranges()
    assert saved(Copier(TorchDevice(torch.device("cpu")), chunk=100), parts) == \
        b"".join(part.numpy().tobytes() for part in parts)


COPIES = 10  # pieces of at most 64 bytes: 4 (250 bytes) + 1 (7) + 0 (0) + 5 (301)


@pytest.mark.parametrize("refuse", range(1, COPIES + 1))
def test_a_refused_copy_leaves_nothing_pending(refuse: int) -> None:
    parts = ranges()
    out = FakeDevice(refuse)
    with pytest.raises(RuntimeError, match=f"copy {refuse} refused"):
        saved(Copier(out, chunk=64), parts)
    assert out.pending == 0, f"expected 0, found {out.pending}"


@pytest.mark.parametrize("fail_at", [0, 64, 300, 500])
def test_a_failing_sink_leaves_nothing_pending(fail_at: int) -> None:
    out = FakeDevice()
    with pytest.raises(OSError, match="disk full"):
        saved(Copier(out, chunk=64), ranges(), fail_at)
    assert out.pending == 0, f"expected 0, found {out.pending}"


def test_the_drain_is_what_empties_the_queue_on_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # a copier that skipped its drain on the error path would leave the copy it queued pending
    monkeypatch.setattr(FakeDevice, "drain", lambda self: None)
    device = FakeDevice(refuse=3)
    with pytest.raises(RuntimeError):
        saved(Copier(device, chunk=64), ranges())
    assert device.pending == 1

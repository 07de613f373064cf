"""The copy layer: bytes go out through two staging windows in order, summed on the device as the
host would sum them, and on every error path (a refused copy, a failing sink) nothing is left
pending on the device when the call returns.

The fake device (``fake_device``) runs its work only when it is waited for, so a staging buffer
reused too early would copy the wrong bytes; it refuses the Nth copy (a gather or a copy out).
"""

from __future__ import annotations

import gc

import pytest
import torch
from fake_device import FakeDevice

from tfd.store.checksum import word_sum
from tfd.store.copies import Copier, TorchDevice, host_bytes


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

    summed = copier.save(parts, sink)
    assert summed == word_sum(torch.frombuffer(bytearray(out), dtype=torch.uint8))
    return bytes(out)


def test_bytes_go_out_in_order() -> None:
    device = FakeDevice()
    parts = ranges()
    assert saved(Copier(device, chunk=64), parts) == b"".join(part.numpy().tobytes() for part in parts)
    assert device.pending == 0 and device.began == 1


@pytest.mark.parametrize("chunk", [4, 100, 1024])
def test_the_cpu_device_copies_the_same_bytes(chunk: int) -> None:
    parts = ranges()
    assert saved(Copier(TorchDevice(torch.device("cpu")), chunk=chunk), parts) == \
        b"".join(part.numpy().tobytes() for part in parts)


def test_a_window_is_whole_words() -> None:
    with pytest.raises(ValueError, match="positive multiple of 4 bytes, not 66"):
        Copier(FakeDevice(), chunk=66)


COPIES = 18  # 558 bytes in windows of 64: 9 windows, each gathered and copied out


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
    assert device.pending == 3  # the first window's gather, sum and copy out


@pytest.mark.gpu
def test_the_gpu_gathers_sums_and_copies_out_what_the_host_would() -> None:
    generator = torch.Generator().manual_seed(5)
    parts = [torch.randint(0, 256, (size,), generator=generator, dtype=torch.uint8)
             for size in (3 << 20, 7, 0, 5 << 20 | 2, 1 << 20)]
    got = saved(Copier(TorchDevice(torch.device("cuda")), chunk=2 << 20), [part.cuda() for part in parts])
    assert got == b"".join(part.numpy().tobytes() for part in parts)


def test_host_bytes_keep_their_tensor_alive() -> None:
    # the view is the only reference to a temporary (as a digest of ``part.cpu()`` had it): its bytes must
    # stay the tensor's while host memory is freed and handed out again around it
    view = host_bytes(torch.full((65536,), 7, dtype=torch.uint8).clone())
    gc.collect()
    churn = [torch.full((65536,), 1, dtype=torch.uint8) for _ in range(32)]
    assert bytes(view) == b"\x07" * 65536 and len(churn) == 32

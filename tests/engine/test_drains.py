"""The trio loop's copy streams and drains (``tfd.engine.drains``): a drain handed over from another
thread is awaited on the loop without blocking it, its stream and buffers released only once its
copies are done, whatever is cancelled meanwhile; a wait that fails still releases; once the loop is
gone, the thread that hands a drain over waits for it itself."""

from __future__ import annotations

import threading

import pytest
import torch
import trio
import trio.lowlevel
from fake_device import FakeDevice

from tfd.engine.drains import CopyStreams
from tfd.store.copies import Drain

WAIT_S = 30.0  # for a thread or a drain the test let go: they take microseconds


class Slow(FakeDevice):
    """A fake device whose waits block until ``go`` is set; ``fail``: then they raise."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.go = threading.Event()
        self.fail = fail

    def wait(self, mark: object) -> None:
        if not self.go.wait(WAIT_S):
            raise TimeoutError("the test never let the wait go")
        if self.fail:
            raise RuntimeError("the device is broken")
        super().wait(mark)


def queued_drain(copies: CopyStreams, released: list[str]) -> tuple[Slow, Drain]:
    """A stream lent from ``copies`` with a copy queued on it, and its drain, which notes who released it."""
    device = copies.streams.lend()
    assert isinstance(device, Slow)
    device.to_device(torch.ones(8, dtype=torch.uint8), torch.zeros(8, dtype=torch.uint8))

    def release() -> None:
        assert device.pending == 0, f"released with {device.pending} copies queued"
        released.append(threading.current_thread().name)
        copies.streams.give_back(device)

    return device, Drain(device, device.mark(), release)


def from_thread(call: object) -> None:
    """``call()`` on a thread of its own, as the restore thread hands drains over."""
    assert callable(call)
    thread = threading.Thread(target=call, name="restore")
    thread.start()
    thread.join(WAIT_S)


async def test_a_drain_is_awaited_on_the_loop_which_goes_on_meanwhile() -> None:
    copies = CopyStreams(torch.device("cpu"), 2, lambda device: Slow())
    released: list[str] = []
    device, drain = queued_drain(copies, released)
    await trio.to_thread.run_sync(from_thread, lambda: copies(drain))
    await trio.lowlevel.checkpoint()
    assert copies.draining == 1 and device.pending == 1 and len(copies.streams.free) == 1
    ticks = 0
    for _ in range(20):  # the loop runs while the drain waits
        await trio.lowlevel.checkpoint()
        ticks += 1
    assert ticks == 20 and released == []
    device.go.set()
    with trio.fail_after(WAIT_S):
        await copies.wait_idle()
    assert copies.draining == 0 and device.pending == 0 and len(copies.streams.free) == 2
    assert released and released[0] not in ("restore", threading.main_thread().name)


async def test_a_drain_outlives_the_cancel_of_whatever_waited_for_it() -> None:
    copies = CopyStreams(torch.device("cpu"), 1, lambda device: Slow())
    released: list[str] = []
    device, drain = queued_drain(copies, released)
    with trio.CancelScope() as scope:  # a request whose client left
        copies(drain)
        scope.cancel()
        await copies.wait_idle()
    assert scope.cancelled_caught and released == [] and copies.draining == 1
    device.go.set()
    with trio.fail_after(WAIT_S):
        await copies.wait_idle()
    assert len(released) == 1 and device.pending == 0 and copies.streams.free == [device]


async def test_a_wait_that_fails_still_gives_the_stream_back(caplog: pytest.LogCaptureFixture) -> None:
    copies = CopyStreams(torch.device("cpu"), 1, lambda device: Slow(fail=True))
    device = copies.streams.lend()
    assert isinstance(device, Slow)
    device.go.set()
    copies(Drain(device, device.mark(), lambda: copies.streams.give_back(device)))
    with trio.fail_after(WAIT_S):
        await copies.wait_idle()
    assert copies.streams.free == [device]
    assert "waiting for a read back's copies failed" in caplog.text


def test_once_the_loop_has_ended_the_thread_that_hands_a_drain_over_waits_for_it() -> None:
    async def made() -> CopyStreams:
        return CopyStreams(torch.device("cpu"), 1, lambda device: Slow())

    copies = trio.run(made)
    released: list[str] = []
    device, drain = queued_drain(copies, released)
    device.go.set()
    from_thread(lambda: copies(drain))
    assert released == ["restore"] and device.pending == 0

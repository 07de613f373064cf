"""The copy streams the daemon's trio loop owns, and the drains it awaits.

A lane's state read back from disk (``tfd.cache.learned``) runs its copies on a stream lent from
``CopyStreams.streams``: made here once, when the engine starts on the trio thread, and kept for the
daemon's life (a stream is reused, never made a request). When a read back ends, what is still queued
on its stream comes here as a ``Drain``: the trio loop awaits it (the wait itself on a worker thread,
so the loop goes on serving), shielded from cancellation, and only then are the stream and the staging
buffers given back. A drain belongs to no request: a client that leaves, a lane cancelled, a failed copy
or a checksum that does not match all hand their drain here alike, and it runs to its end.

Threads: ``__call__`` may be called from any thread (the restore thread calls it); it hands the drain
to the trio loop. When the loop is gone (its run has ended) the caller waits for the drain itself.
``wait_idle`` (the engine's ``close``, on SIGTERM's drain too) returns once every drain handed here
has ended.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import torch
import trio

from tfd.store.copies import Device, Drain, Streams

log = logging.getLogger("tfd.engine")


class CopyStreams:
    """``count`` copy streams on ``device`` (``make`` makes one), and the drains of their reads back.
    Make it on the trio thread that will await the drains."""

    def __init__(self, device: torch.device, count: int, make: Callable[[torch.device], Device]) -> None:
        self.streams = Streams(lambda: make(device), count)
        self._token = trio.lowlevel.current_trio_token()
        self._lock = threading.Lock()
        self._open = 0  # drains handed over, not ended: counted by the thread that hands one over
        self._idle = trio.Event()  # set when the last one ends (trio thread)

    def __call__(self, drain: Drain) -> None:
        """Await ``drain`` on the trio loop (any thread); on this thread when the loop has ended."""
        with self._lock:
            self._open += 1
        try:
            self._token.run_sync_soon(trio.lowlevel.spawn_system_task, self._drain, drain)
        except trio.RunFinishedError:
            try:
                drain.wait_and_release()
            finally:
                self._ended()

    @property
    def draining(self) -> int:
        """Drains handed over and not ended."""
        with self._lock:
            return self._open

    async def wait_idle(self) -> None:
        """Return once every drain handed over has ended, those handed over meanwhile too (trio thread)."""
        while self.draining:
            if self._idle.is_set():
                self._idle = trio.Event()
            await self._idle.wait()

    async def _drain(self, drain: Drain) -> None:
        try:
            with trio.CancelScope(shield=True):  # its buffers go back only once its copies are done
                await trio.to_thread.run_sync(drain.wait_and_release)
        except Exception:  # a broken device: the engine's next step says so; the stream was released
            log.exception("waiting for a read back's copies failed")
        finally:
            self._ended()
            self._idle.set()

    def _ended(self) -> None:
        with self._lock:
            self._open -= 1

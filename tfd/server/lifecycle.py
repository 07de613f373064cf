"""The daemon's life: loading, ready, draining; and the running work a drain waits for.

One ``Lifecycle`` per daemon, owned by the trio loop (not thread-safe). Work is counted by
``Lifecycle.work()``, a context manager the request paths hold while a request runs; a drain stops
new work (``admitting`` turns false) and waits until the count reaches zero or its timeout.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterator
from contextlib import contextmanager

import trio


class Phase(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"


class NotAdmitting(Exception):
    """New work is refused: the daemon is still loading or already draining."""

    def __init__(self, phase: Phase) -> None:
        self.phase = phase
        super().__init__(f"the server is {phase.value}; try again later")


class Lifecycle:
    def __init__(self) -> None:
        self.phase = Phase.LOADING
        self.started_monotonic = time.monotonic()
        self.started_wall = time.time()
        self.drain_requested = trio.Event()
        self.drain_reason = ""
        self._running = 0
        self._idle = trio.Event()
        self._idle.set()

    @property
    def uptime(self) -> float:
        return time.monotonic() - self.started_monotonic

    @property
    def admitting(self) -> bool:
        return self.phase is Phase.READY

    @property
    def running(self) -> int:
        return self._running

    def ready(self) -> None:
        if self.phase is Phase.LOADING:
            self.phase = Phase.READY

    def request_drain(self, reason: str) -> bool:
        """Stop admitting and wake the daemon's drain; False when a drain already began."""
        if self.drain_requested.is_set():
            return False
        self.phase = Phase.DRAINING
        self.drain_reason = reason
        self.drain_requested.set()
        return True

    def begin_work(self) -> None:
        """Count one piece of running work; raises ``NotAdmitting`` unless ready. Pair each with
        ``end_work`` (a streamed reply ends its work when the stream ends, after its handler)."""
        if not self.admitting:
            raise NotAdmitting(self.phase)
        self._running += 1
        self._idle = trio.Event() if self._running == 1 else self._idle

    def end_work(self) -> None:
        self._running -= 1
        if self._running == 0:
            self._idle.set()

    @contextmanager
    def work(self) -> Iterator[None]:
        """``begin_work`` and ``end_work`` around a block."""
        self.begin_work()
        try:
            yield
        finally:
            self.end_work()

    async def wait_idle(self) -> None:
        """Return once no work runs."""
        while self._running:
            await self._idle.wait()

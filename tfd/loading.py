"""A weights load's progress: the terminal bar, and reports to whoever listens (the daemon's STATUS=).

This module sits at the bottom of the import graph (the standard library and attrs only):
``tfd.checkpoint`` reports here as it reads, and a caller that wants the progress wraps the load in
``reporting(listener)``. The listener travels in a context variable, so the loaders between the two
(``tfd.models``, the families) need not pass it, and a worker thread started with a copy of the
context (``trio.to_thread.run_sync`` copies it) reports to it too.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TextIO

import attrs

log = logging.getLogger("tfd.loading")
GIB, MIB, KIB = 1 << 30, 1 << 20, 1 << 10


@attrs.frozen
class LoadProgress:
    """How far a load is: whole files read of ``files``, bytes read of ``total``."""

    files_done: int
    files: int
    done: int
    total: int

    def line(self) -> str:
        """``3 of 8 files, 12.1 of 18.0 GiB``: the unit is the total's (GiB, MiB or KiB)."""
        scale, unit = next(((s, u) for s, u in ((GIB, "GiB"), (MIB, "MiB")) if self.total >= s), (KIB, "KiB"))
        return (f"{self.files_done} of {self.files} file{'s' if self.files != 1 else ''}, "
                f"{self.done / scale:.1f} of {self.total / scale:.1f} {unit}")


Listener = Callable[[LoadProgress], None]
_LISTENER: ContextVar[Listener | None] = ContextVar("tfd_load_listener", default=None)


@contextlib.contextmanager
def reporting(listener: Listener) -> Iterator[None]:
    """While the block runs, every load in this context reports to ``listener`` (``Progress``)."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)


class Progress:
    """One load's progress: a one-line bar on ``stream`` (None: no bar), and reports to the listener
    ``reporting`` set in this context, if any.

    The bar is redrawn in place at most every ``DRAW_S``; the listener hears at most every
    ``REPORT_S`` and once more at ``close``. Error handling: a listener that raises is logged and
    dropped for the rest of the load, which goes on.
    """

    DRAW_S = 0.1
    REPORT_S = 0.25

    def __init__(self, total: int, files: int, stream: TextIO | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.files = files
        self.stream = stream
        self.clock = clock
        self.listener = _LISTENER.get()
        self.done = 0
        self.files_done = 0
        self.began = clock()
        self.drawn = self.reported = -self.REPORT_S

    @property
    def state(self) -> LoadProgress:
        return LoadProgress(self.files_done, self.files, self.done, self.total)

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        self._tick()

    def file_done(self) -> None:
        self.files_done += 1
        self._tick()

    def close(self) -> None:
        """The last state: the bar drawn and its line ended, the listener told."""
        self._report(self.clock())
        if self.stream is not None:
            self._draw(self.clock())
            self.stream.write("\n")
            self.stream.flush()

    def _tick(self) -> None:
        now = self.clock()
        if now - self.drawn >= self.DRAW_S:
            self.drawn = now
            self._draw(now)
        if now - self.reported >= self.REPORT_S:
            self._report(now)

    def _report(self, now: float) -> None:
        if self.listener is None:
            return
        self.reported = now
        try:
            self.listener(self.state)
        except Exception:  # progress is a courtesy: the load goes on without it
            log.exception("the load progress listener failed; no more reports for this load")
            self.listener = None

    def _draw(self, now: float) -> None:
        if self.stream is None:
            return
        mb, seconds = 1e6, max(now - self.began, 1e-9)
        percent = 100 * self.done // self.total if self.total else 100
        self.stream.write(f"\rloading weights {self.done / mb:9.1f} / {self.total / mb:.1f} MB "
                          f"{percent:3d}% {self.done / mb / seconds:8.1f} MB/s")
        self.stream.flush()

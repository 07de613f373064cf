"""systemd's notify protocol and watchdog, in our own few lines (sd_notify(3)).

``notify`` sends one datagram of ``KEY=VALUE`` lines to ``$NOTIFY_SOCKET``. ``keep_watchdog`` pings
``WATCHDOG=1`` at half of ``$WATCHDOG_USEC``, and only while every heartbeat is fresh, so a stuck
engine thread gets the service restarted instead of pinged forever.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping

import trio

log = logging.getLogger("tfd.systemd")


def notify(*fields: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``fields`` (``"READY=1"``, ``"STATUS=..."``) to systemd; False when not under systemd.

    Error handling: a socket that cannot be reached is logged, not raised; serving goes on, and
    systemd, missing the message, acts on its own timeouts.
    """
    environ = os.environ if environ is None else environ
    address = environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # the abstract namespace
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall("\n".join(fields).encode())
    except OSError as error:
        log.error("could not notify systemd at %s: %s", environ["NOTIFY_SOCKET"], error)
        return False
    return True


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between required pings, or None when systemd watches no watchdog for us."""
    environ = os.environ if environ is None else environ
    usec = environ.get("WATCHDOG_USEC", "")
    pid = environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid != str(os.getpid()):  # meant for another process of the unit
        return None
    return int(usec) / 1e6


class Heartbeat:
    """A thread's proof of life: it calls ``beat`` at least every ``max_age`` seconds.

    ``beat`` is safe from any thread (one float store under the GIL).
    """

    def __init__(self, name: str, max_age: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.max_age = max_age
        self._clock = clock
        self._last = clock()

    def beat(self) -> None:
        self._last = self._clock()

    def age(self) -> float:
        return self._clock() - self._last

    def fresh(self) -> bool:
        return self.age() <= self.max_age


class Heartbeats:
    """The heartbeats the watchdog requires; none registered means nothing can be stale."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._beats: dict[str, Heartbeat] = {}

    def add(self, heartbeat: Heartbeat) -> None:
        with self._lock:
            self._beats[heartbeat.name] = heartbeat

    def remove(self, name: str) -> None:
        with self._lock:
            self._beats.pop(name, None)

    def stale(self) -> list[str]:
        """Names of heartbeats older than their limit."""
        with self._lock:
            beats = list(self._beats.values())
        return [beat.name for beat in beats if not beat.fresh()]


async def keep_watchdog(
    interval: float,
    heartbeats: Heartbeats,
    send: Callable[[str], object] = notify,
) -> None:
    """Ping ``WATCHDOG=1`` every ``interval / 2`` seconds while no heartbeat is stale.

    Runs until cancelled. A stale heartbeat is logged once per episode, and pings stop until it
    beats again.
    """
    stale_before: list[str] = []
    while True:
        stale = heartbeats.stale()
        if not stale:
            send("WATCHDOG=1")
        elif stale != stale_before:
            log.error("watchdog: no ping while stale: %s", ", ".join(stale))
        stale_before = stale
        await trio.sleep(interval / 2)

"""The notify function and the watchdog's rule: ping only while every heartbeat is fresh."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import pytest
import trio
import trio.testing

from tfd.server.systemd import Heartbeat, Heartbeats, keep_watchdog, notify, watchdog_interval


def test_notify_sends_one_datagram(short_tmp: Path) -> None:
    path = short_tmp / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind(str(path))
        assert notify("READY=1", "STATUS=ready", environ={"NOTIFY_SOCKET": str(path)})
        assert receiver.recv(4096) == b"READY=1\nSTATUS=ready"


def test_notify_reaches_the_abstract_namespace() -> None:
    name = f"tfd-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind("\0" + name)
        assert notify("STOPPING=1", environ={"NOTIFY_SOCKET": "@" + name})
        assert receiver.recv(4096) == b"STOPPING=1"


def test_notify_without_systemd_does_nothing() -> None:
    assert notify("READY=1", environ={}) is False


def test_notify_to_a_dead_socket_is_logged_not_raised(short_tmp: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        assert notify("READY=1", environ={"NOTIFY_SOCKET": str(short_tmp / "gone")}) is False
    assert "could not notify systemd" in caplog.text


@pytest.mark.parametrize(("environ", "interval"), [
    ({"WATCHDOG_USEC": "30000000"}, 30.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 30.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "soon"}, None),
    ({}, None),
])
def test_watchdog_interval(environ: dict[str, str], interval: float | None) -> None:
    assert watchdog_interval(environ) == interval


async def test_watchdog_pings_only_while_every_heartbeat_is_fresh(
        autojump_clock: trio.testing.MockClock) -> None:
    now = [0.0]
    engine = Heartbeat("engine", max_age=1.0, clock=lambda: now[0])
    heartbeats = Heartbeats()
    heartbeats.add(engine)
    sent: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(keep_watchdog, 0.2, heartbeats, sent.append)
        await trio.sleep(0.95)
        assert sent == ["WATCHDOG=1"] * 10  # every 0.1 s while fresh
        now[0] = 1.5  # the engine has not beaten for 1.5 s
        await trio.sleep(1.0)
        assert len(sent) == 10
        engine.beat()
        await trio.sleep(0.5)
        assert len(sent) == 15
        heartbeats.remove("engine")  # nothing registered: nothing can be stale
        now[0] = 99.0
        await trio.sleep(0.5)
        assert len(sent) == 20
        nursery.cancel_scope.cancel()

"""Draining: no new work, running work finishes, a timeout, and a second signal."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest
import trio

from support import InProcessDaemon
from tfd.server.admin import call
from tfd.server.lifecycle import NotAdmitting, Phase


async def started(nursery: trio.Nursery, workdir: Path, **env: str) -> InProcessDaemon:
    served = InProcessDaemon(workdir, **env)
    await nursery.start(served.run)
    return served


async def test_drain_waits_for_running_work_and_admits_none(short_tmp: Path) -> None:
    async with trio.open_nursery() as nursery:
        served = await started(nursery, short_tmp)
        lifecycle = served.daemon.lifecycle
        with lifecycle.work():
            answer = await trio.to_thread.run_sync(call, served.daemon.admin_path, "drain")
            assert answer == {"ok": True, "drain": {"started": True, "running": 1, "timeout_s": 30.0}}
            again = await trio.to_thread.run_sync(call, served.daemon.admin_path, "drain")
            assert again["drain"]["started"] is False  # type: ignore[index]
            async with httpx.AsyncClient() as client:
                health = await client.get(served.url + "/health")
            assert health.status_code == 503
            assert health.json()["state"] == "draining"
            with pytest.raises(NotAdmitting, match="draining"), lifecycle.work():
                pass
            await trio.sleep(0.3)
            assert not served.done.is_set()  # held by the running work
        with trio.fail_after(10):
            await served.done.wait()
    assert served.status == 0
    assert not served.daemon.admin_path.exists()


async def test_drain_gives_up_after_its_timeout(short_tmp: Path) -> None:
    async with trio.open_nursery() as nursery:
        served = await started(nursery, short_tmp, TF_DRAIN_TIMEOUT_S="0.3")
        with served.daemon.lifecycle.work():
            began = time.monotonic()
            served.daemon.lifecycle.request_drain("test")
            with trio.fail_after(10):
                await served.done.wait()
            waited = time.monotonic() - began
    assert served.status == 0
    assert 0.3 <= waited < 8


async def test_a_second_signal_exits_at_once(short_tmp: Path) -> None:
    async with trio.open_nursery() as nursery:
        served = await started(nursery, short_tmp)
        with served.daemon.lifecycle.work():
            os.kill(os.getpid(), signal.SIGTERM)
            with trio.fail_after(5):
                await served.daemon.lifecycle.drain_requested.wait()
            assert served.daemon.lifecycle.phase is Phase.DRAINING
            assert served.daemon.lifecycle.drain_reason == "SIGTERM"
            os.kill(os.getpid(), signal.SIGINT)
            with trio.fail_after(2):
                await served.done.wait()
    assert served.status == 128 + signal.SIGINT
    assert not served.daemon.admin_path.exists()

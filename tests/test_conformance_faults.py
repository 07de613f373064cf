"""Planted faults turn the conformance kit red by name. Each faulty variant is built here, in the
test, on a daemon run in-process (the shipped code has none): a resume that reads a kept state one
token early fails resumed == fresh; a batched step that gives a lane after the first the wrong
position fails concurrent == solo; a verify round's commit that skips the conv tail fails drafted ==
plain; a cancelled lane that keeps its pages fails the soak (a leak)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import trio

from support import InProcessDaemon
from tfd.cache.kept import KeptState, KeptStates
from tfd.conformance import soak as soak_module
from tfd.conformance.client import Client
from tfd.conformance.gates import PROFILES, Profile
from tfd.conformance.kit import check
from tfd.conformance.report import Report
from tfd.conformance.soak import soak
from tfd.engine.lane import Lane
from tfd.engine.runner import Runner
from tfd.model.decode_batch import Columns
from tfd.model.memory import LaneMemory
from tfd.pool.pages import Lease
from tfd_kernels import conv1d

# The quick profile cut to what each planted fault needs to show: two prompts, lanes side by side in
# twos, one conversation (each gate's code the same; three fifths of the quick profile's requests)
FAULTS = Profile("faults", prompts=2, levels=(1, 2), drafts=(True, False), conversations=1, new_tokens=12)


@pytest.fixture(autouse=True)
def faults_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PROFILES, FAULTS.name, FAULTS)


async def checked(workdir: Path) -> Report:
    """The faults profile against a daemon of the demo model (trained: its tokens follow its state
    closely, where a tiny random checkpoint's barely move), in this process."""
    async with trio.open_nursery() as nursery:
        served = InProcessDaemon(workdir)
        await nursery.start(served.run)
        client = Client(served.url, None, served.daemon.admin_path)
        found = await trio.to_thread.run_sync(check, client, served.url, FAULTS.name)
        served.daemon.lifecycle.request_drain("test over")
    return found


def failing(report: Report) -> set[str]:
    return {row.gate for row in report.rows if not row.ok}


async def test_a_state_read_one_token_early_fails_resumed(short_tmp: Path, monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    real = KeptStates.resume

    def early(self: KeptStates, lease: Lease, memory: LaneMemory, state: KeptState) -> int:
        return real(self, lease, memory, state) - 1  # the state's last token goes in twice

    monkeypatch.setattr(KeptStates, "resume", early)
    found = await checked(short_tmp)
    assert "resumed" in failing(found) and not found.ok
    assert {"repeat", "concurrent", "drafted", "refusals", "cancel"}.isdisjoint(failing(found))


async def test_a_lane_whose_batch_slot_moves_its_position_fails_concurrent(
        short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = Columns.pack

    def shifted(self: Columns, heads: list[list[int]], tails: list[np.ndarray], pinned: bool = False,
                padded_to: int = 0, padding: np.ndarray | None = None) -> torch.Tensor:
        # a decode step's every lane after its first one position on (a lane's head: token, position, keys)
        moved = [head if i == 0 else [head[0], head[1] + 1, head[2] + 1, *head[3:]]
                 for i, head in enumerate(heads)]
        return real(self, moved, tails, pinned, padded_to, padding)

    monkeypatch.setattr(Columns, "pack", shifted)
    found = await checked(short_tmp)
    assert "concurrent" in failing(found) and not found.ok
    assert {"repeat", "resumed", "refusals", "cancel"}.isdisjoint(failing(found))
    wrong = [row for row in found.rows if row.gate == "concurrent" and not row.ok]
    assert all(row.key["concurrency"] > 1 for row in wrong)


async def test_a_rollback_that_skips_the_conv_tail_fails_drafted(short_tmp: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # a verify round's commit leaves each GDN layer's conv tail as it was before the window
    monkeypatch.setattr(conv1d, "reference_rebuild", lambda *args, **kwargs: None)
    found = await checked(short_tmp)
    assert "drafted" in failing(found) and not found.ok
    assert {"refusals", "cancel"}.isdisjoint(failing(found))


async def test_a_cancelled_lane_that_keeps_its_pages_fails_the_soak(short_tmp: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    real = Runner.close

    def keeping(self: Runner, lane: Lane) -> None:
        if lane.cancelled:  # a client that went away: its lease is never finished
            lane.released()
            return
        real(self, lane)

    monkeypatch.setattr(Runner, "close", keeping)
    monkeypatch.setattr(soak_module, "SETTLE_S", 3.0)
    async with trio.open_nursery() as nursery:
        served = InProcessDaemon(short_tmp)
        await nursery.start(served.run)
        client = Client(served.url, None, served.daemon.admin_path)
        found = await trio.to_thread.run_sync(partial(soak, client, 3600.0, 4, requests=24))
        served.daemon.lifecycle.request_drain("test over")
    assert found.left > 0 and found.failures == 0
    assert not found.ok and "free" in found.leaks and found.leaks["free"][1] < found.leaks["free"][0]

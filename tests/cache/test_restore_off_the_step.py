"""A lane resuming a conversation from disk reads its state off the engine thread: the other lanes'
steps go on meanwhile, it joins them once its state is in place (its tokens a fresh lane's), and a lane
that leaves while its state is read gives its pages back only once the read has ended.

The copies to the device go through a fake device held shut by the test (``Held``): a read stays in
flight, its files read and its first copy queued, until the test lets it go, so what the engine does
meanwhile is seen step by step.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
import tiny_models
import torch
from fake_device import FakeDevice

from support import CACHE
from tfd.bench.workload import drive
from tfd.cache.learned import Learned
from tfd.checkpoint import Checkpoint
from tfd.engine.lane import Lane, Phase
from tfd.engine.local_runner import runner_for
from tfd.engine.request import Request, Sampling
from tfd.engine.runner import Runner
from tfd.engine.scheduler import Scheduler
from tfd.engine.stepper import Stepper
from tfd.families.hybrid import HybridModel, load_model
from tfd.store.store import Store

STEP_TOKENS = 128
READ_S = 30.0  # how long a test waits for a read let go to end: the reads of a few KiB take milliseconds


class Held(FakeDevice):
    """A fake device whose copies to the device wait, on the thread that queues them, until ``open``."""

    def __init__(self) -> None:
        super().__init__()
        self.open = threading.Event()
        self.queuing = threading.Event()  # a copy waits to be queued: the read is in flight

    def to_device(self, source: torch.Tensor, target: torch.Tensor) -> None:
        self.queuing.set()
        if not self.open.wait(READ_S):
            raise TimeoutError("the test never let the read go")
        super().to_device(source, target)


@pytest.fixture(scope="module")
def model() -> HybridModel:
    path = tiny_models.save("qwen3_5", CACHE / "tiny-plain", head=True)
    return load_model(Checkpoint.open(path), "cpu", torch.float32, progress=False)


def turns() -> tuple[Request, Callable[[tuple[int, ...]], Request], Request]:
    """A first turn, the second turn made from its reply, and an unrelated request."""
    generator = torch.Generator().manual_seed(5)
    first = Request("t1", tuple(torch.randint(8, tiny_models.VOCAB, (140,), generator=generator).tolist()), 8,
                    Sampling(0.0))
    said = tuple(torch.randint(8, tiny_models.VOCAB, (40,), generator=generator).tolist())

    def second(reply: tuple[int, ...]) -> Request:
        prompt = first.prompt + reply
        return attrs.evolve(first, id="t2", prompt=prompt + said, keep_at=(len(prompt),), max_tokens=12)

    other = Request("other", tuple(range(10, 60)), 30, Sampling(1.0, seed=3))
    return first, second, other


def learning(model: HybridModel, root: Path, device: Callable[[torch.device], FakeDevice] | None = None
             ) -> Runner:
    runner = runner_for(model, 512, 3, graphs=False, kept_pages=64)
    assert runner.cache is not None
    store = Store(root, "test", 1 << 30, 1 << 30, 0)
    learned = Learned(store, runner.pool, torch.device("cpu")) if device is None else \
        Learned(store, runner.pool, torch.device("cpu"), device)
    runner.cache.attach(learned)
    return runner


def written(runner: Runner) -> None:
    assert runner.cache is not None and runner.cache.learned is not None
    runner.cache.learned.close()


def held_runner(model: HybridModel, root: Path) -> tuple[Runner, Held]:
    """A runner on the store at ``root`` whose reads back go through a ``Held`` device."""
    devices: list[FakeDevice] = []

    def make(device: torch.device) -> FakeDevice:
        devices.append(FakeDevice() if not devices else Held())  # the writer's, then the read's stream
        return devices[-1]

    runner = learning(model, root, make)
    held = devices[1]
    assert isinstance(held, Held)
    return runner, held


def test_other_lanes_step_while_a_lane_reads_its_state_back(model: HybridModel, tmp_path: Path) -> None:
    first, second, other = turns()
    before = learning(model, tmp_path)
    reply = drive(model, [first], STEP_TOKENS, graphs=False, runner=before).tokens[0]
    written(before)
    fresh = drive(model, [second(reply), other], STEP_TOKENS, graphs=False).tokens

    runner, held = held_runner(model, tmp_path)
    stepper = Stepper(Scheduler(STEP_TOKENS, 3), runner)
    busy, resuming = Lane(0, other), Lane(1, second(reply))
    stepper.add(busy)
    stepper.add(resuming)
    step = stepper.step()
    assert [lane.request.id for lane in step.admitted] == ["other"]  # the resuming lane is not admitted yet
    assert resuming.phase is Phase.RESTORE and held.queuing.wait(READ_S)
    for _ in range(5):  # the read is held: the other lane's prompt goes through and it decodes
        stepper.step()
    assert busy.phase is Phase.DECODE and len(busy.generated) >= 4 and resuming.phase is Phase.RESTORE
    held.open.set()
    admitted: list[Lane] = []
    while not stepper.idle:
        admitted += stepper.step().admitted
    assert admitted == [resuming] and resuming.cached == 128  # admitted once its state was in place
    assert (tuple(resuming.generated), tuple(busy.generated)) == fresh
    assert held.pending == 0, f"expected 0, found {held.pending}"
    runner.pool.check_at_load()
    written(runner)


def test_a_lane_that_leaves_while_its_state_is_read_gives_its_pages_back_once_the_read_ends(
        model: HybridModel, tmp_path: Path) -> None:
    first, second, _ = turns()
    before = learning(model, tmp_path)
    reply = drive(model, [first], STEP_TOKENS, graphs=False, runner=before).tokens[0]
    written(before)
    runner, held = held_runner(model, tmp_path)
    stepper = Stepper(Scheduler(STEP_TOKENS, 3), runner)
    leaving = Lane(0, second(reply))
    stepper.add(leaving)
    stepper.step()
    assert leaving.phase is Phase.RESTORE and held.queuing.wait(READ_S)
    leaving.cancel()
    step = stepper.step()
    assert [ending.reason for ending in step.ended] == ["cancelled"]
    assert leaving.lease is not None and not stepper.idle  # its pages are the read's until it ends
    held.open.set()
    while not stepper.idle:
        stepper.step()
    assert leaving.lease is None and held.pending == 0
    runner.pool.check_at_load()
    written(runner)

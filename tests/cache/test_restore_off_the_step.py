"""A lane resuming a conversation from disk reads its state off the engine thread: the other lanes'
steps go on meanwhile, it joins them once its state is in place (its tokens a fresh lane's), and a lane
that leaves while its state is read gives its pages back only once the read has ended.

The copies to the device go through a fake device held shut by the test (``Held``): a read stays in
flight, its files read and its first copy queued, until the test lets it go, so what the engine does
meanwhile is seen step by step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
import tiny_models
import torch
import trio
from fake_device import FakeDevice
from hypothesis import given, settings
from hypothesis import strategies as st

from support import CACHE
from tfd.bench.workload import drive
from tfd.cache.learned import Learned
from tfd.checkpoint import Checkpoint
from tfd.engine.drains import CopyStreams
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


def learning(model: HybridModel, root: Path, device: Callable[[torch.device], FakeDevice] | None = None,
             copies: CopyStreams | None = None) -> Runner:
    """A runner on the store at ``root``; ``copies``: the trio loop's streams and drains."""
    runner = runner_for(model, 512, 3, graphs=False, kept_pages=64)
    assert runner.cache is not None
    store = Store(root, "test", 1 << 30, 1 << 30, 0)
    learned = Learned(store, runner.pool, torch.device("cpu")) if device is None else \
        Learned(store, runner.pool, torch.device("cpu"), device) if copies is None else \
        Learned(store, runner.pool, torch.device("cpu"), device, streams=copies.streams, drains=copies)
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


def test_other_lanes_step_while_a_lane_reads_its_state_back(model: HybridModel, tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
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
    queued = time.monotonic()
    for _ in range(5):  # the read is held: the other lane's prompt goes through and it decodes
        stepper.step()
    assert busy.phase is Phase.DECODE and len(busy.generated) >= 4 and resuming.phase is Phase.RESTORE
    held_s = time.monotonic() - queued
    caplog.set_level("INFO", logger="tfd.engine")
    held.open.set()
    admitted: list[Lane] = []
    while not stepper.idle:
        admitted += stepper.step().admitted
    assert admitted == [resuming] and resuming.cached == 128  # admitted once its state was in place
    # the log places its wait: the read took at least as long as the test held it
    said = [record.getMessage() for record in caplog.records if "read back:" in record.getMessage()]
    assert len(said) == 1
    assert said[0].startswith(f"request {resuming.request.id} resumed 128 tokens read back")
    assert float(said[0].split("read in ")[1].split(" s")[0]) >= held_s
    # and before the read: queued for the engine, then taken in by its thread
    queued_at, taken_at = (float(said[0].split(word)[1].split(" s")[0])
                           for word in ("engine at ", "taken at "))
    assert queued_at <= taken_at
    # and after it: its first token, in the step it went on in (its new rows beside the other's one)
    first = [record.getMessage() for record in caplog.records if "first token, its state read back" in
             record.getMessage()]
    assert len(first) == 1 and first[0].startswith(f"request {resuming.request.id}'s first token")
    assert first[0].endswith(f" and {resuming.prompt_length - 128 + 1} rows"), first[0]
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


class Gate(FakeDevice):
    """``Held`` without the wait once ``open`` is set; copy ``refuse`` (from 1, counted over every read
    back on this device) raises."""

    def __init__(self, refuse: int | None, open: threading.Event) -> None:
        super().__init__(refuse)
        self.open = open

    def to_device(self, source: torch.Tensor, target: torch.Tensor) -> None:
        if not self.open.wait(READ_S):
            raise TimeoutError("the test never let the read go")
        super().to_device(source, target)


@pytest.fixture(scope="module")
def conversations(model: HybridModel, tmp_path_factory: pytest.TempPathFactory
                  ) -> tuple[Path, list[Request], list[tuple[int, ...]]]:
    """A store holding three first turns, the second turns that resume them, and each second turn's
    tokens from a fresh runner."""
    root = tmp_path_factory.mktemp("learned")
    generator = torch.Generator().manual_seed(8)
    firsts = [Request(f"t1-{i}", tuple(torch.randint(8, tiny_models.VOCAB, (70 + 60 * i,),
                                                     generator=generator).tolist()), 6, Sampling(0.0))
              for i in range(3)]
    before = learning(model, root)
    replies = drive(model, firsts, STEP_TOKENS, graphs=False, runner=before).tokens
    written(before)
    seconds = [attrs.evolve(first, id=f"t2-{i}", prompt=first.prompt + reply + (9, 10, 11),
                            keep_at=(len(first.prompt + reply),), max_tokens=8)
               for i, (first, reply) in enumerate(zip(firsts, replies, strict=True))]
    fresh = [drive(model, [second], STEP_TOKENS, graphs=False).tokens[0] for second in seconds]
    return root, seconds, fresh


@settings(deadline=None, max_examples=12, derandomize=True, database=None)
@given(cancels=st.lists(st.one_of(st.none(), st.integers(0, 8)), min_size=3, max_size=3),
       refuse=st.one_of(st.none(), st.integers(1, 7)), release=st.integers(0, 6), shut=st.booleans())
def test_reads_back_interleaved_with_steps_failures_and_cancels_leave_nothing_behind(
        model: HybridModel, conversations: tuple[Path, list[Request], list[tuple[int, ...]]],
        cancels: list[int | None], refuse: int | None, release: int, shut: bool) -> None:
    # three lanes resume from disk, each read on a copy stream lent from the three a trio loop owns
    # (the first stream refuses its copy ``refuse``), a fourth lane runs beside them; the streams may
    # be shut for the first steps; lanes leave at random steps; what a read leaves queued is drained
    # on the loop. However it goes: a lane that ran to its end drew a fresh lane's tokens, the
    # stepping thread never waited for a copy, nothing is pending on any stream and every stream is
    # back, and the pool is as at load.
    root, seconds, fresh = conversations
    opened = threading.Event()
    if not shut:
        opened.set()
    gates: list[Gate] = []

    def gate(device: torch.device) -> Gate:
        gates.append(Gate(refuse if not gates else None, opened))
        return gates[-1]

    async def stepped() -> tuple[dict[int, str], list[Lane]]:
        copies = CopyStreams(torch.device("cpu"), 3, gate)
        runner = learning(model, root, lambda device: FakeDevice(), copies)
        stepper = Stepper(Scheduler(STEP_TOKENS, 4), runner)
        lanes = [Lane(i, second) for i, second in enumerate(seconds)]
        lanes.append(Lane(3, Request("other", tuple(range(10, 40)), 8, Sampling(1.0, seed=2))))
        for lane in lanes:
            stepper.add(lane)
        ended: dict[int, str] = {}
        deadline, step = time.monotonic() + READ_S, 0
        while not stepper.idle and time.monotonic() < deadline:
            if step == release:
                opened.set()
            for lane, at in zip(lanes[:3], cancels, strict=True):
                if at == step:
                    lane.cancel()
            done = stepper.step()
            ended |= {ending.lane.number: ending.reason for ending in done.ended}
            step += 1
            await trio.sleep(0.001 if not done.works and runner.restoring else 0)  # the loop drains
        assert stepper.idle, "the lanes never ended"
        with trio.fail_after(READ_S):
            await copies.wait_idle()
        assert len(copies.streams.free) == 3, "a stream was not given back"
        runner.pool.check_at_load()
        written(runner)
        return ended, lanes

    ended, lanes = trio.run(stepped)
    for lane, expected in zip(lanes[:3], fresh, strict=True):
        if ended.get(lane.number) == "length":
            assert tuple(lane.generated) == expected, lane.request.id
    assert set(ended) == {0, 1, 2, 3}
    for found in gates:
        assert found.pending == 0, f"expected 0, found {found.pending}"
        assert threading.main_thread().name not in found.waiters  # the stepping thread waited for no copy
        if found.waiters:  # lent to a read: the trio loop awaited what it left queued, on a worker thread
            assert any("wait_and_release" in name for name in found.waiters), found.waiters


@pytest.mark.gpu
def test_on_the_gpu_a_state_read_back_on_its_own_stream_resumes_as_fresh(tmp_path: Path) -> None:
    # copy streams, the compute stream's mark at admission, the scatter on the lent stream and the
    # drain before the lane runs, with CUDA graphs: the resumed turn draws a fresh runner's tokens
    path = tiny_models.save("qwen3_5", CACHE / "tiny-plain", head=True)
    model = load_model(Checkpoint.open(path), "cuda", torch.bfloat16, progress=False)
    first, second, other = turns()

    def runner(root: Path | None) -> Runner:
        made = runner_for(model, 512, 3, graphs=True, kept_pages=64)
        if root is not None:
            assert made.cache is not None
            made.cache.attach(Learned(Store(root, "test", 1 << 30, 1 << 30, 0), made.pool,
                                      torch.device("cuda"), lanes=3))
        return made

    before = runner(tmp_path)
    reply = drive(model, [first], STEP_TOKENS, graphs=True, runner=before).tokens[0]
    written(before)
    asked = [second(reply), other]
    fresh = drive(model, asked, STEP_TOKENS, graphs=True, runner=runner(None)).tokens
    after = runner(tmp_path)
    resumed = drive(model, asked, STEP_TOKENS, graphs=True, runner=after)
    assert resumed.tokens == fresh and resumed.cached[0] == 128
    written(after)

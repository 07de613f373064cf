"""resumed == fresh from kept prompt states in memory, for every family's tiny checkpoint.

A conversation's second turn resends the first turn's prompt and reply and adds to them. Turn one runs
through a runner with a prompt cache, which keeps each lane's state where its prefill passed a keep
point; turn two, through the same runner, resumes from the longest state its prompt extends. Its
tokens must be a fresh runner's, greedy and seeded, with the MTP head drafting and not. Every run ends
with the pool at its census at load (``drive`` raises ``Leak`` otherwise: pages only kept states hold
count free), and once the cache is cleared every page is free again.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import tiny_models
import torch
from fake_device import FakeDevice

from support import CACHE
from tfd.bench.workload import drive
from tfd.cache.kept import KeptState, KeptStates
from tfd.cache.learned import Learned
from tfd.cache.prefixes import keep_points
from tfd.checkpoint import Checkpoint
from tfd.engine.local_runner import runner_for
from tfd.engine.request import Request, Sampling
from tfd.engine.runner import Drafting, Runner
from tfd.families.hybrid import HybridModel, load_model
from tfd.store import sealed
from tfd.store.store import Store

STEP_TOKENS = 128  # a turn-two prompt takes several steps: its chunks end at keep points and step ends
NEW = 10


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen4_exp"])
def model(request: pytest.FixtureRequest) -> HybridModel:
    path: Path = tiny_models.save(str(request.param), CACHE / "tiny-plain", head=True)
    return load_model(Checkpoint.open(path), "cpu", torch.float32, progress=False)


def first_turns(temperature: float, count: int = 3) -> list[Request]:
    """Prompts of 70 to 200 tokens: each keeps a state at its last row rounded down to 64."""
    generator = torch.Generator().manual_seed(5)
    made = []
    for i in range(count):
        prompt = torch.randint(8, tiny_models.VOCAB, (70 + 65 * i,), generator=generator)
        made.append(Request(f"t1-{i}", tuple(prompt.tolist()), NEW, Sampling(temperature, seed=20 + i)))
    return made


def second_turns(first: list[Request], replies: tuple[tuple[int, ...], ...]) -> list[Request]:
    """Each first turn's prompt and reply and 30 to 90 new tokens; the point before the new tokens is
    a keep mark, as a chat's latest user message is."""
    generator = torch.Generator().manual_seed(6)
    made = []
    for i, (request, reply) in enumerate(zip(first, replies, strict=True)):
        said = tuple(torch.randint(8, tiny_models.VOCAB, (30 + 30 * i,), generator=generator).tolist())
        prompt = request.prompt + reply
        made.append(attrs.evolve(request, id=f"t2-{i}", prompt=prompt + said, keep_at=(len(prompt),)))
    return made


def cached_runner(model: HybridModel, drafting: Drafting | None, pages: int = 64, keep_gain: int = 0
                  ) -> Runner:
    return runner_for(model, 512, 3, graphs=False, drafting=drafting, kept_pages=pages, keep_gain=keep_gain)


def kept_of(runner: Runner) -> KeptStates:
    """The runner's prompt cache's states in memory."""
    assert runner.cache is not None
    return runner.cache.kept


def disk_of(runner: Runner) -> Learned:
    """The runner's prompt cache's states on disk."""
    assert runner.cache is not None and runner.cache.learned is not None
    return runner.cache.learned


def kept_bytes(runner: Runner) -> dict[tuple[int, bytes, int], bytes]:
    """Each kept state's bytes: its pieces (GDN states, conv tails, PLE tail and history) and the
    row pages before its position (whole pages here: 64-row pages, positions multiples of 64)."""
    found = {}
    for key, state in kept_of(runner).states.items():
        assert not state.copied
        pieces = b"".join(view.contiguous().view(torch.uint8).numpy().tobytes()
                          for _, view in sorted(state.pieces.items()))
        rows = b"".join(runner.pool.page_bytes_view(page).numpy().tobytes() for page in state.shared)
        found[key] = pieces + rows
    return found


def same_states(resumed: Runner, fresh: Runner) -> int:
    """How many states both runners kept, after asserting that each has the same bytes in both."""
    ours, theirs = kept_bytes(resumed), kept_bytes(fresh)
    both = set(ours) & set(theirs)
    for key in both:
        assert ours[key] == theirs[key], f"the state at {key[0]} differs"
    return len(both)


@pytest.mark.parametrize("drafts", [0, 2])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_second_turn_resumed_from_memory_draws_the_fresh_tokens(model: HybridModel, temperature: float,
                                                                   drafts: int) -> None:
    drafting = Drafting(drafts, 0.0) if drafts else None
    runner = cached_runner(model, drafting)
    first = first_turns(temperature)
    turn1 = drive(model, first, STEP_TOKENS, graphs=False, drafting=drafting, runner=runner)
    assert turn1.cached == (0, 0, 0)
    second = second_turns(first, turn1.tokens)
    cold = cached_runner(model, drafting)
    fresh = drive(model, second, STEP_TOKENS, graphs=False, drafting=drafting, runner=cold)
    assert fresh.cached == (0, 0, 0)
    resumed = drive(model, second, STEP_TOKENS, graphs=False, drafting=drafting, runner=runner)
    assert resumed.tokens == fresh.tokens
    assert resumed.cached == tuple(keep_points(len(r.prompt))[-1] for r in first)  # 64, 128, 192
    assert same_states(runner, cold) >= 3  # what the resumed lanes kept further on, byte for byte
    # the same second turns again resume from the states they kept themselves: their latest marks
    again = drive(model, second, STEP_TOKENS, graphs=False, drafting=drafting, runner=runner)
    assert again.tokens == fresh.tokens
    assert again.cached == tuple(keep_points(len(r.prompt))[-1] for r in second)
    kept = kept_of(runner)
    assert kept.counts.hits == 6 and kept.counts.refused == 0
    assert kept.clear() > 0 and runner.pool.free == runner.pool.pages  # no page outlives the cache


@pytest.mark.parametrize("drafts", [0, 2])
def test_a_resumed_lane_keeps_nothing_closer_than_the_gain_and_the_next_turn_still_draws_fresh(
        model: HybridModel, drafts: int) -> None:
    drafting = Drafting(drafts, 0.0) if drafts else None
    runner = cached_runner(model, drafting, keep_gain=128)
    first = first_turns(1.0)
    turn1 = drive(model, first, STEP_TOKENS, graphs=False, drafting=drafting, runner=runner)
    kept = kept_of(runner)
    assert kept.counts.kept == 3  # a fresh lane keeps at every point: 64, 128, 192
    second = second_turns(first, turn1.tokens)
    fresh = drive(model, second, STEP_TOKENS, graphs=False, drafting=drafting)
    resumed = drive(model, second, STEP_TOKENS, graphs=False, drafting=drafting, runner=runner)
    assert resumed.cached == (64, 128, 192) and resumed.tokens == fresh.tokens
    # their keep points (64; 128 and 192; 192 and 256) lie less than 128 tokens past where they resumed
    assert kept.counts.kept == 3
    again = drive(model, second, STEP_TOKENS, graphs=False, drafting=drafting, runner=runner)
    assert again.cached == (64, 128, 192) and again.tokens == fresh.tokens
    assert kept.counts.hits == 6 and kept.clear() == 3 and runner.pool.free == runner.pool.pages


def test_a_state_without_the_heads_rows_serves_only_lanes_that_do_not_draft(model: HybridModel) -> None:
    drafting = Drafting(2, 0.0)
    runner = cached_runner(model, drafting)
    first = [attrs.evolve(r, draft=False) for r in first_turns(0.0)]
    turn1 = drive(model, first, STEP_TOKENS, graphs=False, drafting=drafting, runner=runner)
    second = second_turns(first, turn1.tokens)
    drafting_lanes = [attrs.evolve(r, draft=True) for r in second]
    fresh = drive(model, drafting_lanes, STEP_TOKENS, graphs=False, drafting=drafting)
    if fresh.drafts.rounds == 0:
        pytest.skip("this family does not draft (several residual streams)")
    plain = drive(model, second, STEP_TOKENS, graphs=False, drafting=drafting, runner=runner)
    assert plain.cached == (64, 128, 192) and plain.tokens == fresh.tokens
    resumed = drive(model, drafting_lanes, STEP_TOKENS, graphs=False, drafting=drafting, runner=runner)
    assert resumed.tokens == fresh.tokens and resumed.cached == (0, 0, 0)  # no state has the head's rows


def test_the_budget_keeps_the_newest_states(model: HybridModel) -> None:
    sized = cached_runner(model, None)
    per_state = kept_of(sized).map.pages + 1  # its pieces, the page its position falls in (64-row pages here)
    runner = runner_for(model, 512, 3, graphs=False, kept_pages=64,
                        kept_bytes=2 * per_state * sized.pool.layout.page_bytes)
    kept = kept_of(runner)
    first = first_turns(0.0)
    turn1 = drive(model, first, STEP_TOKENS, graphs=False, runner=runner)
    assert kept.bytes <= kept.budget and len(kept.states) < 3
    second = second_turns(first, turn1.tokens)
    fresh = drive(model, second, STEP_TOKENS, graphs=False)
    resumed = drive(model, second[::-1], STEP_TOKENS, graphs=False, runner=runner)
    assert resumed.tokens == fresh.tokens[::-1]
    assert resumed.cached[-1] == 0 and kept.counts.evicted > 0  # the first conversation's went first


def test_admission_evicts_kept_states_that_are_in_the_way(model: HybridModel) -> None:
    # a pool of one lane: a new prompt's lane needs the pages the first turn's states hold
    runner = runner_for(model, 512, 1, graphs=False, kept_bytes=1 << 40)  # bounded by the pool alone
    kept = kept_of(runner)
    first = first_turns(0.0, 1)
    drive(model, first, STEP_TOKENS, graphs=False, runner=runner)
    assert kept.states and runner.pool.kept_pages > 0
    other = attrs.evolve(first[0], id="other", prompt=first[0].prompt[::-1], max_tokens=512 - 70)
    fresh = drive(model, [other], STEP_TOKENS, graphs=False)
    assert drive(model, [other], STEP_TOKENS, graphs=False, runner=runner).tokens == fresh.tokens
    assert kept.counts.evicted > 0


@pytest.mark.parametrize("skipped", ["conv_tail", "state", "ple.tail", "ple.history"])
def test_a_resume_that_skips_a_piece_is_caught(model: HybridModel, skipped: str) -> None:
    # the gate can fail: a planted fault (a piece left at its initial value on resume) changes the
    # states the resumed lanes keep further on, even where the few tokens drawn do not show it
    runner, cold = cached_runner(model, None), cached_runner(model, None)
    if not any(name.endswith(skipped) for name in kept_of(runner).map.by_name()):  # known before any run
        pytest.skip(f"this family keeps no {skipped}")
    first = first_turns(1.0)
    turn1 = drive(model, first, STEP_TOKENS, graphs=False, runner=runner)
    second = second_turns(first, turn1.tokens)
    drive(model, second, STEP_TOKENS, graphs=False, runner=cold)
    whole = KeptState.pieces.fget
    assert whole is not None
    with pytest.MonkeyPatch.context() as plant:  # resumes skip it; the states keep every piece
        plant.setattr(KeptState, "pieces", property(
            lambda state: {name: view for name, view in whole(state).items() if not name.endswith(skipped)}))
        resumed = drive(model, second, STEP_TOKENS, graphs=False, runner=runner)
    assert resumed.cached == (64, 128, 192)
    with pytest.raises(AssertionError, match=r"the state at \d+ differs"):
        same_states(runner, cold)


def learning_runner(model: HybridModel, drafting: Drafting | None, root: Path, identity: str = "test"
                    ) -> Runner:
    """A runner with a prompt cache whose states also go to a store under ``root``."""
    runner = cached_runner(model, drafting)
    store = Store(root, identity, 1 << 30, 1 << 30, 0, verify=True)
    assert runner.cache is not None
    runner.cache.attach(Learned(store, runner.pool, torch.device("cpu")))
    return runner


def written(runner: Runner) -> None:
    """Wait for the writer: every state offered is on disk, each file's sums (the payload's summed
    by the device as it was copied out) as the host sums what it reads back."""
    disk_of(runner).close()
    home = disk_of(runner).store.home
    for path in [*home.glob("states/*.st"), *home.glob("blocks/*.blk")]:
        sealed.read(path, "state" if path.suffix == ".st" else "rows")


@pytest.mark.parametrize("drafts", [0, 2])
def test_a_second_turn_after_a_restart_reads_the_first_from_disk(model: HybridModel, drafts: int,
                                                                 tmp_path: Path) -> None:
    drafting = Drafting(drafts, 0.0) if drafts else None
    before = learning_runner(model, drafting, tmp_path)
    first = first_turns(1.0)
    turn1 = drive(model, first, STEP_TOKENS, graphs=False, drafting=drafting, runner=before)
    written(before)
    assert disk_of(before).store.counts.written == 3
    second = second_turns(first, turn1.tokens)
    cold = cached_runner(model, drafting)
    fresh = drive(model, second, STEP_TOKENS, graphs=False, drafting=drafting, runner=cold)
    after = learning_runner(model, drafting, tmp_path)  # a new process: an empty memory, the same disk
    resumed = drive(model, second, STEP_TOKENS, graphs=False, drafting=drafting, runner=after)
    assert resumed.tokens == fresh.tokens and resumed.cached == (64, 128, 192)
    assert same_states(after, cold) >= 3
    written(after)
    assert disk_of(after).store.counts.read == 3


def test_a_damaged_learned_state_is_recomputed(model: HybridModel, tmp_path: Path) -> None:
    before = learning_runner(model, None, tmp_path)
    first = first_turns(0.0)
    turn1 = drive(model, first, STEP_TOKENS, graphs=False, runner=before)
    written(before)
    for block in sorted((tmp_path / "test" / "blocks").iterdir()):
        data = bytearray(block.read_bytes())
        data[len(data) // 2] ^= 0x10
        block.write_bytes(bytes(data))
    second = second_turns(first, turn1.tokens)
    fresh = drive(model, second, STEP_TOKENS, graphs=False)
    after = learning_runner(model, None, tmp_path)
    resumed = drive(model, second, STEP_TOKENS, graphs=False, runner=after)
    assert resumed.tokens == fresh.tokens and resumed.cached == (0, 0, 0)
    assert disk_of(after).store.counts.refused == 3
    written(after)
    third = learning_runner(model, None, tmp_path)
    again = drive(model, second, STEP_TOKENS, graphs=False, runner=third)
    assert again.cached == tuple(keep_points(len(r.prompt))[-1] for r in second)  # what it wrote instead
    written(third)


def test_another_identity_reads_nothing(model: HybridModel, tmp_path: Path) -> None:
    before = learning_runner(model, None, tmp_path, "one")
    first = first_turns(0.0)
    turn1 = drive(model, first, STEP_TOKENS, graphs=False, runner=before)
    written(before)
    second = second_turns(first, turn1.tokens)
    stranger = learning_runner(model, None, tmp_path, "two")
    assert drive(model, second, STEP_TOKENS, graphs=False, runner=stranger).cached == (0, 0, 0)
    written(stranger)


@pytest.mark.parametrize("refuse", [1, 2, None])
def test_a_refused_copy_while_reading_back_answers_that_lane_as_fresh(model: HybridModel, tmp_path: Path,
                                                                    refuse: int | None) -> None:
    # the state's copies to the device (one a file: its block, then its pieces), the first or the
    # second refused: the copy queued before is drained, nothing is pending, and the lane starts from
    # the beginning (a miss; its files stay, they may be sound): its tokens are a fresh lane's, and
    # the pool is as at load afterwards; a device that copies resumes it
    before = learning_runner(model, None, tmp_path)
    first = first_turns(0.0, 1)
    turn1 = drive(model, first, STEP_TOKENS, graphs=False, runner=before)
    written(before)
    devices: list[FakeDevice] = []

    def make(device: torch.device) -> FakeDevice:
        devices.append(FakeDevice(refuse))
        return devices[-1]

    runner = cached_runner(model, None)
    store = Store(tmp_path, "test", 1 << 30, 1 << 30, 0)
    assert runner.cache is not None
    runner.cache.attach(Learned(store, runner.pool, torch.device("cpu"), make))
    second = second_turns(first, turn1.tokens)
    resumed = drive(model, second, STEP_TOKENS, graphs=False, runner=runner)
    reads = devices[1]
    assert reads.pending == 0, f"expected 0, found {reads.pending}"
    assert reads.count == (refuse or 2)
    assert resumed.cached == ((0,) if refuse else (64,))
    assert resumed.tokens == drive(model, second, STEP_TOKENS, graphs=False).tokens
    assert store.counts.refused == 0  # the files were not at fault
    runner.pool.check_at_load()
    written(runner)

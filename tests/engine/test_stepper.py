"""The one step loop: what a step answers, the finish rule on both sides of each end, a failed run.

A tiny qwen3_5 checkpoint on the CPU, greedy: the reference continuation is known first, so a stop
token or a ``max_tokens`` can be put exactly at, before or past where the lane gets to. Every test
ends with the pool at its census at load.
"""

from __future__ import annotations

import pytest
import tiny_models
import torch
from reference_loop import LanePool

from support import CACHE
from tfd.bench.workload import drive
from tfd.checkpoint import Checkpoint
from tfd.engine.lane import Lane, Phase
from tfd.engine.local_runner import runner_for
from tfd.engine.opening import Opener
from tfd.engine.request import Request, Sampling
from tfd.engine.runner import Drafting, Runner
from tfd.engine.scheduler import Scheduler
from tfd.engine.stepper import Ending, Stepper
from tfd.families.hybrid import HybridModel, load_model
from tfd.generate import generate
from tfd.model.memory import Span

STEP_TOKENS = 64
PROMPT = tuple(range(8, 8 + 70))  # two prompt chunks at 64 rows a step
NEW = 6


@pytest.fixture(scope="module")
def model() -> HybridModel:
    path = tiny_models.save("qwen3_5", CACHE / "tiny-plain")
    return load_model(Checkpoint.open(path), "cpu", torch.float32, progress=False)


def greedy(max_tokens: int = NEW, stop_ids: tuple[int, ...] = (), number: int = 0) -> Lane:
    request = Request(f"r{number}", PROMPT, max_tokens, Sampling(temperature=0.0), stop_ids=stop_ids)
    return Lane(number, request)


def until_idle(stepper: Stepper) -> list[Ending]:
    """Step until nothing is left; every lane ended, in order."""
    ended: list[Ending] = []
    for _ in range(100):
        if stepper.idle:
            return ended
        step = stepper.step()
        ended += step.ended
    raise AssertionError("the stepper never went idle")


def stepper_of(model: HybridModel, lanes: int = 2, leaves: dict[str, int] | None = None) -> Stepper:
    runner = runner_for(model, len(PROMPT) + NEW, lanes, graphs=False)
    return Stepper(Scheduler(STEP_TOKENS, lanes), runner, leaves=leaves)


@pytest.fixture(scope="module")
def reference(model: HybridModel) -> list[int]:
    stepper = stepper_of(model)
    lane = greedy()
    stepper.add(lane)
    (ending,) = until_idle(stepper)
    assert ending.reason == "length" and len(lane.generated) == NEW
    assert len(set(lane.generated[:3])) == 3, "the test needs three different first tokens"
    return list(lane.generated)


def test_a_step_answers_admissions_then_tokens_then_endings(model: HybridModel, reference: list[int]) -> None:
    stepper = stepper_of(model)
    lane = greedy()
    stepper.add(lane)
    first = stepper.step()  # admitted, its first chunk run: no token yet
    assert first.admitted == (lane,) and first.rows == 64 and first.emitted == () and first.ended == ()
    second = stepper.step()  # the prompt's last 6 rows: its first token
    assert second.admitted == () and [e.tokens for e in second.emitted] == [(reference[0],)]
    assert lane.phase is Phase.DECODE and lane.position == len(PROMPT)
    until_idle(stepper)
    assert lane.generated == reference and lane.phase is Phase.DONE and lane.lease is None
    stepper.runner.pool.check_at_load()


@pytest.mark.parametrize("limit", [1, NEW - 1, NEW])
def test_max_tokens_ends_at_exactly_that_many(model: HybridModel, reference: list[int], limit: int) -> None:
    stepper = stepper_of(model)
    lane = greedy(max_tokens=limit)
    stepper.add(lane)
    (ending,) = until_idle(stepper)
    assert ending.reason == "length" and lane.generated == reference[:limit]
    stepper.runner.pool.check_at_load()


@pytest.mark.parametrize("at", [0, 2])
def test_a_stop_token_ends_the_lane_and_is_kept(model: HybridModel, reference: list[int], at: int) -> None:
    stepper = stepper_of(model)
    lane = greedy(stop_ids=(reference[at],))
    stepper.add(lane)
    (ending,) = until_idle(stepper)
    assert ending.reason == "stop" and lane.generated == reference[:at + 1]
    stepper.runner.pool.check_at_load()


def test_a_stop_token_never_drawn_ends_nothing(model: HybridModel, reference: list[int]) -> None:
    unused = next(token for token in range(tiny_models.VOCAB) if token not in reference)
    stepper = stepper_of(model)
    lane = greedy(stop_ids=(unused,))
    stepper.add(lane)
    (ending,) = until_idle(stepper)
    assert ending.reason == "length" and lane.generated == reference


@pytest.mark.parametrize("after", [1, NEW - 1])
def test_a_lane_that_leaves_takes_no_token_past_its_count(model: HybridModel, reference: list[int],
                                                          after: int) -> None:
    stepper = stepper_of(model, leaves={"r0": after})
    lane = greedy()
    stepper.add(lane)
    (ending,) = until_idle(stepper)
    assert ending.reason == "cancelled" and lane.generated == reference[:after]
    stepper.runner.pool.check_at_load()


def test_a_failed_run_fails_its_lanes_and_the_stepper_goes_on(model: HybridModel, reference: list[int],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    stepper = stepper_of(model)
    doomed = greedy(number=0)
    stepper.add(doomed)
    real = Runner.run
    with monkeypatch.context() as planted:
        planted.setattr(Runner, "run", lambda self, works: (_ for _ in ()).throw(RuntimeError("planted")))
        step = stepper.step()
    assert isinstance(step.error, RuntimeError) and step.admitted == (doomed,)
    assert [(e.lane, e.reason, e.message) for e in step.ended] == [
        (doomed, "failed", "server error: planted")]
    assert doomed.lease is None and stepper.idle
    stepper.runner.pool.check_at_load()  # its pages are back
    assert Runner.run is real
    after = greedy(number=1)
    stepper.add(after)
    (ending,) = until_idle(stepper)
    assert ending.reason == "length" and after.generated == reference


def test_a_lane_that_cannot_be_opened_ends_failed_and_the_next_is_admitted(
        model: HybridModel, reference: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    stepper = stepper_of(model)
    broken, fine = greedy(number=0), greedy(number=1)
    stepper.add(broken)
    stepper.add(fine)
    real_open = stepper.runner.opener.open

    def opening(lane: Lane, drafts: bool, begin: object = None) -> None:
        if lane is broken:
            raise RuntimeError("planted")
        real_open(lane, drafts, begin)  # type: ignore[arg-type]

    monkeypatch.setattr(stepper.runner.opener, "open", opening)
    step = stepper.step()
    assert step.admitted == (fine,)
    assert [(e.lane, e.reason, e.message) for e in step.ended] == [
        (broken, "failed", "server error: the lane could not be opened")]
    until_idle(stepper)
    assert fine.generated == reference
    stepper.runner.pool.check_at_load()


def test_tfd_generate_gives_the_steppers_tokens_and_raises_for_a_lane_it_cannot_open(
        model: HybridModel, reference: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    done = generate(model, PROMPT, NEW)
    assert done.tokens == reference and done.prefill_s > 0
    assert generate(model, PROMPT, NEW, stop=(reference[1],)).tokens == reference[:2]

    def refuse(self: Opener, lane: Lane, drafts: bool, begin: object = None) -> None:
        raise RuntimeError("planted")

    monkeypatch.setattr(Opener, "open", refuse)
    with pytest.raises(RuntimeError, match="the lane could not be opened"):
        generate(model, PROMPT, NEW)


@pytest.mark.parametrize("least", [0, 2, 3, NEW])
def test_min_tokens_bars_the_stop_token_until_that_many_are_drawn(model: HybridModel, reference: list[int],
                                                                  least: int) -> None:
    stop = reference[2]  # the greedy reply would stop at its third token
    stepper = stepper_of(model)
    lane = Lane(0, Request("r0", PROMPT, NEW, Sampling(temperature=0.0), stop_ids=(stop,), min_tokens=least))
    stepper.add(lane)
    (ending,) = until_idle(stepper)
    if least <= 2:  # not binding: the third token may be the stop token
        assert ending.reason == "stop" and lane.generated == reference[:3]
    else:
        assert stop not in lane.generated[:least] and lane.generated[:2] == reference[:2]
        assert lane.generated[2] != stop and (ending.reason == "length" or lane.generated[-1] == stop)
        assert len(lane.generated) > least or ending.reason == "length"
    stepper.runner.pool.check_at_load()


@pytest.fixture(scope="module")
def headed() -> HybridModel:
    path = tiny_models.save("qwen3_5", CACHE / "tiny-plain", head=True)
    return load_model(Checkpoint.open(path), "cpu", torch.float32, progress=False)


def test_drafted_lanes_with_a_bias_or_min_tokens_draw_the_plain_tokens(headed: HybridModel) -> None:
    plain_run = drive(headed, [greedy(max_tokens=12).request], STEP_TOKENS, graphs=False)
    stop = plain_run.tokens[0][1]
    asked = [Request("barred", PROMPT, 12, Sampling(temperature=0.0), stop_ids=(stop,), min_tokens=4),
             Request("biased", PROMPT, 12, Sampling(temperature=1.0, seed=5, bias=((7, 4.0), (stop, -2.0)))),
             Request("both", PROMPT, 12, Sampling(temperature=1.0, seed=6, bias=((9, 3.0),)),
                     stop_ids=(stop,), min_tokens=12)]
    serial = drive(headed, asked, STEP_TOKENS, graphs=False).tokens
    drafted = drive(headed, asked, STEP_TOKENS, graphs=False, drafting=Drafting(3, 0.0))
    assert drafted.tokens == serial and drafted.drafts.rounds > 0
    assert stop not in serial[0][:4] and stop not in serial[2]


def penalized_reference(model: HybridModel, prompt: tuple[int, ...], count: int, frequency: float,
                        presence: float, repetition: float) -> list[int]:
    """Greedy tokens with the penalties applied as vLLM applies them, written out here on the
    reference loop's forward (the engine's own sampler not used)."""
    lanes = LanePool(model, len(prompt) + count)
    try:
        lane = lanes.open()
        hidden = lanes.forward([Span(lane, 0, torch.tensor(prompt))]).hidden
        out: list[int] = []
        for _ in range(count):
            logits = model.logits(hidden[-1:])[0].float().clone()
            for token in set(prompt) | set(out):
                value = logits[token]
                logits[token] = value / repetition if value > 0 else value * repetition
            for token in set(out):
                logits[token] -= frequency * out.count(token) + presence
            out.append(int(logits.argmax()))
            step = torch.tensor([out[-1]])
            hidden = lanes.forward([Span(lane, len(prompt) + len(out) - 1, step, decode=True)]).hidden
        return out
    finally:
        lanes.close()


@pytest.mark.parametrize(("frequency", "presence", "repetition"), [(2.0, 0.0, 1.0), (0.0, 1.5, 1.0),
                                                                  (0.0, 0.0, 3.0), (0.5, -0.5, 1.5)])
def test_penalized_greedy_tokens_are_the_references(model: HybridModel, headed: HybridModel, frequency: float,
                                                    presence: float, repetition: float) -> None:
    expected = penalized_reference(model, PROMPT, 12, frequency, presence, repetition)
    assert expected != penalized_reference(model, PROMPT, 12, 0.0, 0.0, 1.0)  # the penalty tells
    setting = Sampling(temperature=0.0, frequency_penalty=frequency, presence_penalty=presence,
                       repetition_penalty=repetition)
    other = Request("q", PROMPT[::-1], 12, Sampling(temperature=1.0, seed=3))
    asked = [Request("p", PROMPT, 12, setting), other]
    assert drive(model, asked, STEP_TOKENS, graphs=False).tokens[0] == tuple(expected)
    alone = drive(model, asked[:1], STEP_TOKENS, graphs=False).tokens[0]
    assert alone == tuple(expected)
    serial = drive(headed, asked, STEP_TOKENS, graphs=False).tokens
    drafted = drive(headed, asked, STEP_TOKENS, graphs=False, drafting=Drafting(3, 0.0))
    assert drafted.tokens == serial and drafted.drafts.rounds > 0

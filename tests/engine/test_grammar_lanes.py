"""Lanes that follow grammars: every draw one the grammar allows, and the contract with them.

A tiny served qwen3_5 checkpoint (the demo's tokenizer) with a random MTP head, on the CPU. A lane
with a JSON Schema's grammar ends on an end token with JSON that validates, greedy and sampled; it
draws alone what it draws beside lanes of other grammars and of none, drafted what it draws plainly,
resumed from a kept prompt state what it draws fresh. A token its grammar refuses fails that lane
alone.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import jsonschema
import pytest
import tiny_models
import tokenizers
import torch

from support import CACHE
from tfd.bench.workload import drive
from tfd.checkpoint import Checkpoint
from tfd.demo import ASSETS, ENDOFTEXT, IM_END
from tfd.engine import decode_pipeline, grammar_masks
from tfd.engine import grammar as grammar_module
from tfd.engine import graphs as graphs_module
from tfd.engine.drawn import Drawn
from tfd.engine.grammar import Grammar, GrammarRefused, Vocabulary
from tfd.engine.grammar_masks import allowed
from tfd.engine.lane import Lane
from tfd.engine.local_runner import runner_for
from tfd.engine.request import Request, Sampling
from tfd.engine.runner import Drafting
from tfd.engine.scheduler import Scheduler, Work
from tfd.engine.stepper import Ending, Stepper
from tfd.families.hybrid import HybridModel, load_model
from tfd.server.structured import Constraint, grammar, json_rule

STEP_TOKENS = 64
PROMPT = tuple(range(8, 8 + 70))
STOPS = (IM_END, ENDOFTEXT)
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "tags": {"type": "array", "items": {"enum": ["a", "bc"]},
                                                    "maxItems": 2}},
          "required": ["name", "age", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def model() -> HybridModel:
    path = tiny_models.save_served("qwen3_5", CACHE / "tiny-head", head=True)
    return load_model(Checkpoint.open(path), "cpu", torch.float32, progress=False)


@pytest.fixture(scope="module")
def tokenizer() -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_file(str(Path(ASSETS) / "demo_tokenizer.json"))


@pytest.fixture(scope="module")
def vocabulary(model: HybridModel, tokenizer: tokenizers.Tokenizer) -> Vocabulary:
    return Vocabulary(tokenizer.to_str(), model.cfg.vocab, STOPS)


def schema_grammar(vocabulary: Vocabulary, schema: dict[str, object] = SCHEMA) -> Grammar:
    return vocabulary.compile(grammar(Constraint(json_rule(schema), "test"), False, vocabulary.special))


def asked(name: str, compiled: Grammar | None, seed: int | None, max_tokens: int = 60) -> Request:
    sampling = Sampling(temperature=0.0) if seed is None else Sampling(temperature=1.0, seed=seed)
    return Request(name, PROMPT, max_tokens, sampling, stop_ids=STOPS, grammar=compiled)


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_a_lane_with_a_schema_ends_on_an_end_token_with_json_that_validates(
        model: HybridModel, vocabulary: Vocabulary, tokenizer: tokenizers.Tokenizer,
        seed: int | None) -> None:
    request = asked("json", schema_grammar(vocabulary), seed)
    (tokens,) = drive(model, [request], STEP_TOKENS, graphs=False).tokens
    assert tokens[-1] in STOPS
    jsonschema.validate(json.loads(tokenizer.decode(list(tokens[:-1]))), SCHEMA)
    free = drive(model, [asked("free", None, seed, len(tokens))], STEP_TOKENS, graphs=False).tokens[0]
    assert free != tokens  # the grammar is what made it JSON


def test_a_grammar_lane_draws_beside_others_what_it_draws_alone(model: HybridModel,
                                                                vocabulary: Vocabulary) -> None:
    alone = drive(model, [asked("json", schema_grammar(vocabulary), 4)], STEP_TOKENS, graphs=False).tokens[0]
    choice = vocabulary.compile(grammar(Constraint('"yes" | "no"', "test"), False, vocabulary.special))
    for others in (1, 3, 8):
        beside = [asked(f"o{i}", [None, choice, schema_grammar(vocabulary)][i % 3], i, 20 + i)
                  for i in range(others)]
        together = drive(model, [*beside, asked("json", schema_grammar(vocabulary), 4)], STEP_TOKENS,
                         graphs=False).tokens
        assert together[-1] == alone
        alone_others = [drive(model, [request], STEP_TOKENS, graphs=False).tokens[0] for request in beside]
        assert list(together[:-1]) == alone_others


@pytest.mark.parametrize("beside", ["penalty", "bias", "min_tokens", "plain"])
def test_a_grammar_lane_draws_the_same_whether_its_step_is_redrawn_on_the_device_or_drawn_on_the_host(
        model: HybridModel, vocabulary: Vocabulary, beside: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # a step whose lanes all draw plainly redraws its rows masked with its own keys; beside a lane the
    # host adds to (a penalty, a bias, a stop token barred) the step's lanes are drawn on the host
    alone = drive(model, [asked("json", schema_grammar(vocabulary), 4)], STEP_TOKENS, graphs=False).tokens[0]
    sampling = {"penalty": Sampling(temperature=1.0, seed=5, frequency_penalty=0.8),
                "bias": Sampling(temperature=1.0, seed=5, bias=((9, 3.0),)),
                "min_tokens": Sampling(temperature=1.0, seed=5), "plain": Sampling(temperature=1.0, seed=5)}
    other = Request("other", PROMPT, 24, sampling[beside], stop_ids=STOPS,
                    min_tokens=20 if beside == "min_tokens" else 0)
    other_alone = drive(model, [other], STEP_TOKENS, graphs=False).tokens[0]
    on_host = []
    real = decode_pipeline.host_draw
    monkeypatch.setattr(decode_pipeline, "host_draw", lambda *a: on_host.append(1) or real(*a))
    together = drive(model, [other, asked("json", schema_grammar(vocabulary), 4)], STEP_TOKENS,
                     graphs=False).tokens
    assert together == (other_alone, alone)
    assert bool(on_host) is (beside != "plain")


def test_drafted_grammar_lanes_draw_the_plain_tokens(model: HybridModel, vocabulary: Vocabulary) -> None:
    requests = [asked("greedy", schema_grammar(vocabulary), None),
                asked("sampled", schema_grammar(vocabulary), 7), asked("free", None, 8, 30)]
    plain = drive(model, requests, STEP_TOKENS, graphs=False).tokens
    drafted = drive(model, requests, STEP_TOKENS, graphs=False, drafting=Drafting(3, 0.0))
    assert drafted.tokens == plain and drafted.drafts.rounds > 0 and drafted.drafts.drafted > 0


def test_a_resumed_grammar_lane_draws_what_a_fresh_one_does(model: HybridModel,
                                                            vocabulary: Vocabulary) -> None:
    runner = runner_for(model, len(PROMPT) + 60, 1, graphs=False, kept_states=2)
    first = drive(model, [asked("json", schema_grammar(vocabulary), 9)], STEP_TOKENS, graphs=False,
                  runner=runner)
    again = drive(model, [asked("json", schema_grammar(vocabulary), 9)], STEP_TOKENS, graphs=False,
                  runner=runner)
    assert first.cached == (0,) and again.cached[0] > 0
    assert again.tokens == first.tokens


def test_the_masks_of_a_drafted_window_follow_the_drafts_and_stop_past_a_refused_one(
        vocabulary: Vocabulary, tokenizer: tokenizers.Tokenizer) -> None:
    compiled = vocabulary.compile(grammar(Constraint('"yes" | "no"', "test"), False, vocabulary.special))
    matcher = compiled.matcher()
    ids = tokenizer.encode("yes", add_special_tokens=False).ids
    no = tokenizer.encode("no", add_special_tokens=False).ids
    mask = allowed(4, [(matcher, 0, [ids[0], no[0]])])

    def allows(row: int, token: int) -> bool:
        return bool((int(mask[row, token // 32]) >> (token % 32)) & 1)

    assert allows(0, ids[0]) and allows(0, no[0]) and not allows(0, 100)
    assert allows(1, ids[1]) if len(ids) > 1 else allows(1, IM_END)  # after the first draft held
    assert mask[3].eq(-1).all()  # past the refused draft: all ones, its draw is not kept
    with pytest.raises(GrammarRefused):
        compiled.matcher().take(100)


def test_a_token_the_grammar_refuses_fails_that_lane_and_not_the_others(
        model: HybridModel, vocabulary: Vocabulary) -> None:
    runner = runner_for(model, len(PROMPT) + 8, 2, graphs=False)
    stepper = Stepper(Scheduler(STEP_TOKENS, 2), runner)
    choice = vocabulary.compile(grammar(Constraint('"yes, " "and yes again, " "and again"', "test"), False,
                                        vocabulary.special))
    strict, free = Lane(0, asked("strict", choice, 1, 8)), Lane(1, asked("free", None, 2, 8))
    stepper.add(strict)
    stepper.add(free)
    while strict.position < len(PROMPT) or free.position < len(PROMPT):
        step = stepper.step()
        assert not step.ended
    ended: list[Ending] = []
    before = list(strict.generated)
    works = [Work(lane, lane.position, 1, decode=True, samples=True) for lane in (strict, free)]
    emitted = stepper._take([Drawn(works[0], (100,), None), Drawn(works[1], (100,), None)], 0.0, ended)
    assert [(ending.lane.request.id, ending.reason) for ending in ended] == [("strict", "failed")]
    assert "not allowed" in ended[0].message and strict.generated == before  # the refused token not kept
    assert [len(item.tokens) for item in emitted] == [0, 1] and free.generated[-1] == 100
    free.cancel()
    while not stepper.idle:
        stepper.step()
    runner.pool.check_at_load()  # the failed lane's pages are back


@pytest.mark.parametrize(("logprobs", "ahead"), [(None, True), (2, False)])
def test_a_grammar_lanes_next_step_runs_ahead_unless_it_asks_for_logprobs(
        model: HybridModel, vocabulary: Vocabulary, logprobs: int | None, ahead: bool) -> None:
    runner = runner_for(model, len(PROMPT) + 40, 2, graphs=False)
    stepper = Stepper(Scheduler(STEP_TOKENS, 2), runner)
    sampling = Sampling(temperature=1.0, seed=3, logprobs=logprobs)
    lanes = [Lane(i, Request(f"g{i}", PROMPT, 30, sampling, stop_ids=STOPS,
                             grammar=schema_grammar(vocabulary))) for i in range(2)]
    for lane in lanes:
        stepper.add(lane)
    seen = []
    while not stepper.idle:
        step = stepper.step()
        pipeline = runner.pipeline
        assert pipeline is not None
        if step.works and all(work.decode for work in step.works) and not step.ended:
            seen.append(pipeline.ahead is not None and pipeline.ahead.on_host)
    assert seen and all(seen) is ahead and any(seen) is ahead
    runner.pool.check_at_load()


@pytest.mark.parametrize("beside", [None, "penalty"])
def test_a_run_ahead_steps_masks_fill_once_on_the_grammar_thread_while_the_host_goes_on(
        model: HybridModel, vocabulary: Vocabulary, beside: str | None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # after the lanes take their tokens the next step's masks start filling on the vocabulary's
    # thread; the draw takes that fill: one fill a draw. Beside a lane the host draws (a penalty)
    # the rows are the same, so is the fill
    fills: list[str] = []
    draws = []
    real_fill, real_allowed = grammar_masks._fill, grammar_masks.allowed
    monkeypatch.setattr(grammar_masks, "_fill",
                        lambda *a: fills.append(threading.current_thread().name) or real_fill(*a))
    monkeypatch.setattr(grammar_masks, "allowed", lambda *a: draws.append(1) or real_allowed(*a))
    requests = [asked(f"g{i}", schema_grammar(vocabulary), i, 30) for i in range(2)]
    if beside == "penalty":
        requests.append(Request("p", PROMPT, 30, Sampling(temperature=1.0, seed=5, frequency_penalty=0.5),
                                stop_ids=STOPS))
    alone = [drive(model, [request], STEP_TOKENS, graphs=False).tokens[0] for request in requests]
    fills.clear()
    draws.clear()
    together = drive(model, requests, STEP_TOKENS, graphs=False).tokens
    assert list(together) == alone
    ahead = [name for name in fills if name.startswith("tfd-grammar")]
    # each draw's masks filled once; beside the lane the host draws, the step after a grammar lane
    # ended draws fewer rows on the host's path than were filled ahead: those are filled again
    assert len(fills) == len(draws) + (beside is not None)
    # on the host's path: a step's until its lanes' steps run ahead, and the refill
    assert len(fills) - len(ahead) <= 2 * len(requests) + (beside is not None)
    assert len(ahead) >= min(len(tokens) for tokens in together[:2]) - 4


def test_a_run_ahead_steps_masks_begin_filling_before_the_lanes_take_their_tokens(
        model: HybridModel, vocabulary: Vocabulary, monkeypatch: pytest.MonkeyPatch) -> None:
    # a step's tokens are judged by the lanes' grammars as soon as they are on the host and the next
    # step's masks begin filling then, so the lanes' takes (text, the finish rule) overlap the fill;
    # without the takes on the mask's bit the fill begins after them. The same tokens either way
    judged: list[bool] = []  # a fill ahead's every matcher had its token judged, not yet taken
    real = grammar_masks.fill_ahead
    monkeypatch.setattr(grammar_masks, "fill_ahead", lambda rows, follows: judged.append(
        all(matcher.judged is not None for matcher, _, _ in follows)) or real(rows, follows))
    requests = [asked(f"g{i}", schema_grammar(vocabulary), i, 30) for i in range(3)]
    alone = [drive(model, [request], STEP_TOKENS, graphs=False).tokens[0] for request in requests]
    judged.clear()
    assert list(drive(model, requests, STEP_TOKENS, graphs=False).tokens) == alone
    assert len(judged) >= min(len(tokens) for tokens in alone) - 4 and all(judged)
    judged.clear()
    monkeypatch.setattr(grammar_module, "TAKE_LATER", False)
    assert list(drive(model, requests, STEP_TOKENS, graphs=False).tokens) == alone
    assert len(judged) >= min(len(tokens) for tokens in alone) - 4 and not any(judged)


@pytest.mark.gpu
@pytest.mark.parametrize("lanes", [1, 3, 4, 5])  # a bucket's only lane; a bucket of 4 short and full; 8 short
def test_a_grammar_steps_redraw_graph_draws_what_the_eager_draw_does(
        vocabulary: Vocabulary, tokenizer: tokenizers.Tokenizer, lanes: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # captured decode steps redraw their grammar rows by a graph a bucket reading the step's outputs;
    # its tokens are the eager step's, beside plain lanes and lanes of another grammar
    path = tiny_models.save_served("qwen3_5", CACHE / "tiny-head", head=True)
    gpu = load_model(Checkpoint.open(path), "cuda", torch.bfloat16, progress=False)
    choice = vocabulary.compile(grammar(Constraint('"yes" | "no"', "test"), False, vocabulary.special))
    requests = [asked(f"r{i}", [schema_grammar(vocabulary), None, choice][i % 3], i or None)
                for i in range(lanes)]
    redrawn = []
    real = graphs_module.DecodeGraphs.redraw
    monkeypatch.setattr(graphs_module.DecodeGraphs, "redraw", lambda *a: redrawn.append(1) or real(*a))
    captured = drive(gpu, requests, STEP_TOKENS, graphs=True).tokens
    assert redrawn
    assert captured == drive(gpu, requests, STEP_TOKENS, graphs=False).tokens
    assert captured[0][-1] in STOPS
    jsonschema.validate(json.loads(tokenizer.decode(list(captured[0][:-1]))), SCHEMA)

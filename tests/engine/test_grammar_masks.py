"""The masks a grammar gives do not depend on how they are filled: tfd's slices against none, ahead
on the grammar thread against on the caller's, matchers compiled for each lane against copies of
one, with JSON strings near and past their maxLength.

The covering tokenizer (the demo's BPE and a ``<id>`` token for every id up to 4,096) and a
schema of bounded strings; lanes walk it by random allowed tokens.
"""

from __future__ import annotations

import sys
import threading

import pytest
import torch

from tfd.engine import grammar, grammar_masks
from tfd.engine.grammar import Vocabulary
from tfd.server.structured import json_rule
from tfd.shapes import covering_tokenizer

VOCAB = 4096
SCHEMA = {"type": "array", "items": {"type": "object", "properties": {
    "a": {"type": "string", "maxLength": 3}, "b": {"type": "string", "maxLength": 9},
    "c": {"type": "string", "maxLength": 10}, "d": {"type": "string", "maxLength": 24}},
    "required": ["a", "b", "c", "d"], "additionalProperties": False}, "minItems": 3}


@pytest.fixture(scope="module")
def text() -> str:
    return covering_tokenizer(VOCAB)


def _walk(vocabulary: Vocabulary, seed: int, steps: int, ahead: bool, own: int = 0) -> list[list[int]]:
    """Four lanes' masks along their own random allowed tokens, a list of words a lane a step;
    ``own`` of the lanes with matchers compiled for them, the others copies of the start."""
    compiled = vocabulary.compile(f"start: {json_rule(SCHEMA)}\n", lanes=own)
    lanes = [compiled.matcher() for _ in range(4)]
    generator = torch.Generator().manual_seed(seed)
    seen = []
    for _ in range(steps):
        follows = [(lane, row, ()) for row, lane in enumerate(lanes)]
        if ahead:
            grammar_masks.fill_ahead(4, follows)
        masks = grammar_masks.allowed(4, follows).clone()
        seen.append(masks.flatten().tolist())
        bits = ((masks[:, :, None] >> torch.arange(32, dtype=torch.int32)) & 1).reshape(4, -1)[:, :VOCAB]
        for lane, row in zip(lanes, bits, strict=True):
            ok = row.nonzero()[:, 0]
            lane.take(int(ok[torch.randint(len(ok), (1,), generator=generator)]))
    return seen


@pytest.mark.parametrize("seed", [1, 2])
def test_the_slices_and_the_fill_ahead_change_no_mask(text: str, seed: int) -> None:
    plain = Vocabulary(text, VOCAB, (0,))
    plain.tokenizer = plain.tokenizer.with_slices([])  # no slicer: every token walked
    expected = _walk(plain, seed, 40, ahead=False)
    served = Vocabulary(text, VOCAB, (0,))
    assert _walk(served, seed, 40, ahead=False) == expected
    assert _walk(served, seed, 40, ahead=True) == expected
    assert _walk(served, seed, 40, ahead=True, own=2) == expected  # two own, two copies
    assert _walk(served, seed, 40, ahead=False, own=4) == expected
    with pytest.MonkeyPatch.context() as patch:  # every take a parser step on this thread, as before
        patch.setattr(grammar, "TAKE_LATER", False)
        assert _walk(served, seed, 40, ahead=True) == expected
    with pytest.MonkeyPatch.context() as patch:  # the fill ahead made at once on this thread
        patch.setattr(grammar_masks, "FILL_ON_THREAD", False)
        assert _walk(served, seed, 40, ahead=True) == expected
    assert len({tuple(masks) for masks in expected}) > 20  # the lanes went places


class _Watched:
    """llguidance's executor, its calls noted as they begin (then made as they were)."""

    def __init__(self, executor: object) -> None:
        self.executor = executor
        self.begun: list[str] = []
        self.stepped: list[list[int]] = []  # each consume_token_par call's tokens
        self.stepped_on: list[str] = []  # and the thread that made it

    def unsafe_compute_mask_ptr(self, *args: object) -> None:
        self.begun.append("fill")
        self.executor.unsafe_compute_mask_ptr(*args)  # type: ignore[attr-defined]

    def consume_token_par(self, matchers: list[tuple[object, int]]) -> list[bool]:
        self.stepped.append([token for _, token in matchers])
        self.stepped_on.append(threading.current_thread().name)
        return self.executor.consume_token_par(matchers)  # type: ignore[attr-defined, no-any-return]


def _allowed_tokens(masks: torch.Tensor, row: int) -> list[int]:
    bits = (masks[row, :, None] >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.flatten()[:VOCAB].nonzero()[:, 0].tolist()


@pytest.mark.parametrize("owed_first", [True, False])
def test_a_take_under_its_fills_mask_is_stepped_by_the_next_fill_and_judged_by_the_masks_bit(
        text: str, owed_first: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A token drawn under the mask the last fill gave its place is judged by the mask's bit (a token
    the mask bars is refused there and then) and stepped by llguidance in the next fill, every lane's
    at once: as the caller makes the fill ready (``OWED_FIRST``), else on the grammar thread; after
    another fill (the mask buffer written again) or with no fill at its place, the take steps
    llguidance itself. The masks are the same either way (the walks above)."""
    monkeypatch.setattr(grammar_masks, "OWED_FIRST", owed_first)
    vocabulary = Vocabulary(text, VOCAB, (0,))
    compiled = vocabulary.compile(f"start: {json_rule(SCHEMA)}\n", lanes=0)
    lanes = [compiled.matcher() for _ in range(3)]
    watched = vocabulary.executor = _Watched(vocabulary.executor)  # type: ignore[assignment]
    masks = grammar_masks.allowed(3, [(lane, row, ()) for row, lane in enumerate(lanes)])
    firsts = [_allowed_tokens(masks, row)[0] for row in range(3)]
    barred = next(t for t in range(VOCAB) if t not in _allowed_tokens(masks, 0))
    with pytest.raises(grammar.GrammarRefused, match=f"token {barred} "):
        lanes[0].take(barred)  # its mask's bit says no
    lanes[1].take(firsts[1])
    lanes[2].take(firsts[2])
    assert watched.stepped == []  # nothing stepped on this thread yet
    grammar_masks.fill_ahead(2, [(lanes[1], 0, ()), (lanes[2], 1, ())])
    masks = grammar_masks.allowed(2, [(lanes[1], 0, ()), (lanes[2], 1, ())])
    assert watched.stepped == [[firsts[1], firsts[2]]]  # the fill stepped both first, all at once
    here = threading.current_thread().name
    assert (watched.stepped_on[0] == here) == owed_first  # this thread's, or the grammar thread's
    seconds = [_allowed_tokens(masks, row)[0] for row in range(2)]
    lanes[1].take(seconds[0])  # under the current fill's mask: owed
    grammar_masks.allowed(1, [(compiled.matcher(), 0, ())])  # another fill: lane 2's row is stale
    lanes[2].take(seconds[1])  # stepped now, on this thread
    grammar_masks.allowed(2, [(lanes[1], 0, ()), (lanes[2], 1, ())])
    assert watched.stepped[1:] == [[seconds[0]]]  # lane 1's owed token, not lane 2's
    with pytest.raises(grammar.GrammarRefused):
        compiled.matcher().take(barred)  # no fill at its place: llguidance judges it


class _Refusing(_Watched):
    """An executor whose llguidance refuses every owed token: the bug ``GrammarRefused`` names."""

    def consume_token_par(self, matchers: list[tuple[object, int]]) -> list[bool]:
        super().consume_token_par(matchers)
        return [False] * len(matchers)


@pytest.mark.parametrize(("owed_first", "on_thread"), [(True, True), (False, True), (True, False)])
def test_an_owed_token_llguidance_refuses_is_raised_where_the_fill_is_asked_for(
        text: str, owed_first: bool, on_thread: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stepped as the fill is made ready or on the grammar thread, the fill made there or at once, a
    refused owed token surfaces where the masks are wanted (``allowed``: the step's error), never out
    of ``fill_ahead`` itself."""
    monkeypatch.setattr(grammar_masks, "OWED_FIRST", owed_first)
    monkeypatch.setattr(grammar_masks, "FILL_ON_THREAD", on_thread)
    vocabulary = Vocabulary(text, VOCAB, (0,))
    compiled = vocabulary.compile(f"start: {json_rule(SCHEMA)}\n", lanes=0)
    lane = compiled.matcher()
    first = _allowed_tokens(grammar_masks.allowed(1, [(lane, 0, ())]), 0)[0]
    lane.take(first)  # owed
    vocabulary.executor = _Refusing(vocabulary.executor)  # type: ignore[assignment]
    grammar_masks.fill_ahead(1, [(lane, 0, ())])
    with pytest.raises(grammar.GrammarRefused, match=f"tokens \\[{first}\\] are not allowed"):
        grammar_masks.allowed(1, [(lane, 0, ())])


def test_a_fill_ahead_is_under_way_when_it_returns(text: str) -> None:
    """The grammar thread needs the GIL to begin: ``fill_ahead`` hands it over and returns only once
    llguidance's call has begun, so the engine thread's bookkeeping after it overlaps the fill instead
    of going before it. With a switch interval no wait here reaches, the thread could take the GIL
    only by that handoff."""
    vocabulary = Vocabulary(text, VOCAB, (0,))
    compiled = vocabulary.compile(f"start: {json_rule(SCHEMA)}\n", lanes=4)
    follows = [(compiled.matcher(), row, ()) for row in range(4)]
    expected = grammar_masks.allowed(4, follows).clone()
    grammar_masks.fill_ahead(4, follows)  # the thread started (its start hands the GIL over anyway), now idle
    assert torch.equal(grammar_masks.allowed(4, follows), expected)
    watched = vocabulary.executor = _Watched(vocabulary.executor)  # type: ignore[assignment]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        grammar_masks.fill_ahead(4, follows)
        begun = list(watched.begun)
    finally:
        sys.setswitchinterval(interval)
    assert begun == ["fill"]
    assert torch.equal(grammar_masks.allowed(4, follows), expected)
    assert watched.begun == ["fill"]  # the fill ahead's masks taken, not filled again


@pytest.mark.parametrize("switch_us", [0, 50])
def test_the_switch_interval_is_short_while_a_fill_is_in_flight_and_as_it_was_after(
        text: str, switch_us: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``FILL_SWITCH_US`` set, the GIL's switch interval is that short from a fill ahead's start
    to its masks taken (or waited for), then Python's own again, through a failed fill too; at 0 it is
    never touched. The masks are the same."""
    monkeypatch.setattr(grammar_masks, "FILL_SWITCH_US", switch_us)
    vocabulary = Vocabulary(text, VOCAB, (0,))
    compiled = vocabulary.compile(f"start: {json_rule(SCHEMA)}\n", lanes=2)
    follows = [(compiled.matcher(), row, ()) for row in range(2)]
    expected = grammar_masks.allowed(2, follows).clone()
    interval = sys.getswitchinterval()
    in_flight = switch_us / 1e6 if switch_us else interval
    grammar_masks.fill_ahead(2, follows)
    assert sys.getswitchinterval() == pytest.approx(in_flight)
    assert torch.equal(grammar_masks.allowed(2, follows), expected)
    assert sys.getswitchinterval() == interval
    grammar_masks.fill_ahead(2, follows)
    vocabulary.settle()  # waited for, not taken
    assert sys.getswitchinterval() == interval
    lane = compiled.matcher()
    lane.take(_allowed_tokens(grammar_masks.allowed(1, [(lane, 0, ())]), 0)[0])  # owed
    vocabulary.executor = _Refusing(vocabulary.executor)  # type: ignore[assignment]
    grammar_masks.fill_ahead(1, [(lane, 0, ())])
    assert sys.getswitchinterval() == pytest.approx(in_flight)
    with pytest.raises(grammar.GrammarRefused):
        grammar_masks.allowed(1, [(lane, 0, ())])
    assert sys.getswitchinterval() == interval


def test_a_judge_takes_a_token_before_the_lanes_take_and_the_next_fill_steps_it(text: str) -> None:
    """``Matcher.judge`` takes a token on its current mask's bit before the lane's take (which then
    only confirms it), so the next fill can begin at once; it declines a barred token, a row another
    fill has passed, and a matcher with no row, leaving those to the take. The fills write two
    buffers in turn: the bits a judge reads stay as they were while the next fill writes."""
    vocabulary = Vocabulary(text, VOCAB, (0,))
    compiled = vocabulary.compile(f"start: {json_rule(SCHEMA)}\n", lanes=0)
    lanes = [compiled.matcher() for _ in range(3)]
    watched = vocabulary.executor = _Watched(vocabulary.executor)  # type: ignore[assignment]
    assert not lanes[0].judge(0)  # no fill gave it a row yet
    follows = [(lane, row, ()) for row, lane in enumerate(lanes)]
    masks = grammar_masks.allowed(3, follows)
    before = masks.clone()
    firsts = [_allowed_tokens(masks, row)[0] for row in range(3)]
    barred = next(t for t in range(VOCAB) if t not in _allowed_tokens(masks, 0))
    assert not lanes[0].judge(barred)  # declined: its take refuses it
    with pytest.raises(grammar.GrammarRefused, match=f"token {barred} "):
        lanes[0].take(barred)
    assert lanes[1].judge(firsts[1]) and lanes[2].judge(firsts[2])
    grammar_masks.fill_ahead(2, [(lanes[1], 0, ()), (lanes[2], 1, ())])  # before the lanes' takes
    lanes[1].take(firsts[1])  # confirmed, not stepped again
    lanes[2].take(firsts[2])
    assert torch.equal(masks, before)  # the fill in flight writes the other buffer
    seconds = grammar_masks.allowed(2, [(lanes[1], 0, ()), (lanes[2], 1, ())])
    assert seconds.data_ptr() != masks.data_ptr()
    assert watched.stepped == [[firsts[1], firsts[2]]]  # once, by the fill
    assert watched.begun == ["fill", "fill"]
    grammar_masks.allowed(1, [(compiled.matcher(), 0, ())])  # another fill: lane 1's row is passed
    assert not lanes[1].judge(_allowed_tokens(seconds, 0)[0])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grammar, "TAKE_LATER", False)
        assert not lanes[2].judge(_allowed_tokens(seconds, 1)[0])


def test_a_fill_ahead_serves_a_draw_of_fewer_rows_of_it(text: str) -> None:
    """A lane that ended after its masks began filling is a row the draw no longer asks for: the
    fill ahead still holds every row asked, so it is taken, not made again; a draw asking a row the
    fill does not hold (or the same rows at another place) waits for it and fills anew."""
    vocabulary = Vocabulary(text, VOCAB, (0,))
    compiled = vocabulary.compile(f"start: {json_rule(SCHEMA)}\n", lanes=3)
    lanes = [compiled.matcher() for _ in range(3)]
    expected = grammar_masks.allowed(3, [(lane, row, ()) for row, lane in enumerate(lanes)]).clone()
    watched = vocabulary.executor = _Watched(vocabulary.executor)  # type: ignore[assignment]
    grammar_masks.fill_ahead(3, [(lane, row, ()) for row, lane in enumerate(lanes)])
    taken = grammar_masks.allowed(3, [(lanes[0], 0, ()), (lanes[2], 2, ())])  # lane 1 ended meanwhile
    assert watched.begun == ["fill"] and torch.equal(taken, expected)
    grammar_masks.fill_ahead(3, [(lanes[0], 0, ()), (lanes[2], 2, ())])
    other = compiled.matcher()
    grammar_masks.allowed(3, [(lanes[0], 0, ()), (other, 1, ()), (lanes[2], 2, ())])  # a row it lacks
    assert watched.begun == ["fill", "fill", "fill"]
    grammar_masks.fill_ahead(3, [(lanes[0], 0, ())])
    grammar_masks.allowed(2, [(lanes[0], 0, ())])  # fewer rows: another step's
    assert len(watched.begun) == 5

"""The masks a grammar gives do not depend on how they are filled: tfd's slices against none, ahead
on the grammar thread against on the caller's, matchers compiled for each lane against copies of
one, with JSON strings near and past their maxLength.

The covering tokenizer (the demo's BPE and a ``<id>`` token for every id up to 4,096) and a
schema of bounded strings; lanes walk it by random allowed tokens.
"""

from __future__ import annotations

import pytest
import torch

from tfd.engine import grammar
from tfd.engine.grammar import GrammarRefused, Vocabulary
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


def _walk(vocabulary: Vocabulary, seed: int, steps: int, ahead: bool | str, own: int = 0) -> list[list[int]]:
    """Four lanes' masks along their own random allowed tokens, a list of words a lane a step;
    ``own`` of the lanes with matchers compiled for them, the others copies of the start; ``ahead``:
    each fill started ahead (``fill_ahead``), or ``"take"``: each step's tokens taken ahead with the
    next masks (``take_ahead``), each lane taking its token after."""
    compiled = vocabulary.compile(f"start: {json_rule(SCHEMA)}\n", lanes=own)
    lanes = [compiled.matcher() for _ in range(4)]
    generator = torch.Generator().manual_seed(seed)
    seen = []
    follows = [(lane, row, ()) for row, lane in enumerate(lanes)]
    for _ in range(steps):
        if ahead is True:
            grammar.fill_ahead(4, follows)
        masks = grammar.allowed(4, follows).clone()
        seen.append(masks.flatten().tolist())
        bits = ((masks[:, :, None] >> torch.arange(32, dtype=torch.int32)) & 1).reshape(4, -1)[:, :VOCAB]
        tokens = []
        for row in bits:
            ok = row.nonzero()[:, 0]
            tokens.append(int(ok[torch.randint(len(ok), (1,), generator=generator)]))
        if ahead == "take":
            grammar.take_ahead(list(zip(lanes, tokens, strict=True)), 4, follows)
        for lane, token in zip(lanes, tokens, strict=True):
            lane.take(token)
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
    assert _walk(served, seed, 40, ahead="take", own=4) == expected
    assert _walk(served, seed, 40, ahead=False, own=4) == expected
    assert len({tuple(masks) for masks in expected}) > 20  # the lanes went places



def test_tokens_taken_ahead_fill_the_rows_asked_for_and_a_refused_one_raises_at_its_take(text: str) -> None:
    vocabulary = Vocabulary(text, VOCAB, (0,))
    compiled = vocabulary.compile(f"start: {json_rule(SCHEMA)}\n", lanes=3)
    lanes = [compiled.matcher() for _ in range(3)]
    opening = vocabulary.tokenizer.tokenize_str("[")[0]
    wrong = vocabulary.tokenizer.tokenize_str("}")[0]
    follows = [(lane, row, ()) for row, lane in enumerate(lanes)]
    grammar.take_ahead([(lanes[0], opening), (lanes[1], opening), (lanes[2], wrong)], 3, follows)
    with pytest.raises(GrammarRefused):
        lanes[2].take(wrong)
    for lane in lanes[:2]:
        lane.take(opening)
    # the lanes of rows 0 and 2 ask (row 1's ended): the fill ahead serves them, row 1 all ones
    masks = grammar.allowed(3, [follows[0], follows[2]]).clone()
    assert masks[1].eq(-1).all()
    again = vocabulary.compile(f"start: {json_rule(SCHEMA)}\n", lanes=1).matcher()
    again.take(opening)
    assert torch.equal(masks[0], grammar.allowed(1, [(again, 0, ())])[0])  # what the place allows
    assert not masks[0].eq(-1).all() and not torch.equal(masks[0], masks[2])
    with pytest.raises(RuntimeError, match="taken ahead"):
        grammar.take_ahead([(lanes[0], opening)], 0, [])
        lanes[0].take(wrong)

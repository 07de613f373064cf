"""The masks a grammar gives do not depend on how they are filled: tfd's slices against none, ahead
on the grammar thread against on the caller's, matchers compiled for each lane against copies of
one, with JSON strings near and past their maxLength.

The covering tokenizer (the demo's BPE and a ``<id>`` token for every id up to 4,096) and a
schema of bounded strings; lanes walk it by random allowed tokens.
"""

from __future__ import annotations

import sys

import pytest
import torch

from tfd.engine import grammar
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
            grammar.fill_ahead(4, follows)
        masks = grammar.allowed(4, follows).clone()
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
    assert len({tuple(masks) for masks in expected}) > 20  # the lanes went places



class _Watched:
    """llguidance's executor, its calls noted as they begin (then made as they were)."""

    def __init__(self, executor: object) -> None:
        self.executor = executor
        self.begun: list[str] = []

    def unsafe_compute_mask_ptr(self, *args: object) -> None:
        self.begun.append("fill")
        self.executor.unsafe_compute_mask_ptr(*args)  # type: ignore[attr-defined]


def test_a_fill_ahead_is_under_way_when_it_returns(text: str) -> None:
    """The grammar thread needs the GIL to begin: ``fill_ahead`` hands it over and returns only once
    llguidance's call has begun, so the engine thread's bookkeeping after it overlaps the fill instead
    of going before it. With a switch interval no wait here reaches, the thread could take the GIL
    only by that handoff."""
    vocabulary = Vocabulary(text, VOCAB, (0,))
    compiled = vocabulary.compile(f"start: {json_rule(SCHEMA)}\n", lanes=4)
    follows = [(compiled.matcher(), row, ()) for row in range(4)]
    expected = grammar.allowed(4, follows).clone()
    grammar.fill_ahead(4, follows)  # the thread started (its start hands the GIL over anyway), now idle
    assert torch.equal(grammar.allowed(4, follows), expected)
    watched = vocabulary.executor = _Watched(vocabulary.executor)  # type: ignore[assignment]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        grammar.fill_ahead(4, follows)
        begun = list(watched.begun)
    finally:
        sys.setswitchinterval(interval)
    assert begun == ["fill"]
    assert torch.equal(grammar.allowed(4, follows), expected)
    assert watched.begun == ["fill"]  # the fill ahead's masks taken, not filled again

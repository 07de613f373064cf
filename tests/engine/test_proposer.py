"""Drafts from the MTP head: absorbed rows land at their positions, chains stop where they should."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tiny_models
import torch
from reference_loop import LanePool

from support import CACHE
from tfd.checkpoint import Checkpoint
from tfd.engine.proposer import Absorb, HeadProposer
from tfd.families.hybrid import HybridModel, load_model
from tfd.model.decode import DecodeMemory
from tfd.model.decode_batch import Columns, DecodeBatch
from tfd.model.memory import LaneMemory, Span

PROMPT = 40
DRAFTS = 4


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_next"])
def headed(request: pytest.FixtureRequest) -> HybridModel:
    path: Path = tiny_models.save(str(request.param), CACHE / "tiny-plain", head=True)
    return load_model(Checkpoint.open(path), dtype=torch.float32, progress=False)


@pytest.fixture
def lanes(headed: HybridModel) -> Iterator[LanePool]:
    pool = LanePool(headed, PROMPT + 2 * DRAFTS, lanes=2, page_rows=8, head=True)
    yield pool
    pool.close()


def prompt() -> list[int]:
    generator = torch.Generator().manual_seed(5)
    return torch.randint(8, tiny_models.VOCAB, (PROMPT + 1,), generator=generator).tolist()


def proposer(headed: HybridModel, lanes: LanePool, confidence: float) -> HeadProposer:
    columns = Columns(len(headed.gdn_layers().layers), lanes.pool.layout.row_pages(lanes.window))
    return HeadProposer(headed, lanes.rows, DecodeMemory(lanes.pool, headed.dtype), columns, confidence)


def prefilled(headed: HybridModel, lanes: LanePool, ids: list[int]) -> tuple[LaneMemory, torch.Tensor]:
    """A lane with the prompt ``ids[:-1]`` prefilled, and the main model's rows for it."""
    lane = lanes.open()
    out = lanes.forward([Span(lane, 0, torch.tensor(ids[:-1]))])
    return lane, headed.draft_input(out)


def test_rows_absorbed_in_one_piece_or_two_give_the_same_drafts(headed: HybridModel, lanes: LanePool) -> None:
    # the head's rows are written at their positions: absorbing the prompt in two pieces (the first
    # chaining drafts whose speculative rows the second overwrites) leaves what one piece leaves
    ids = prompt()
    head = proposer(headed, lanes, confidence=0.0)
    whole, rows = prefilled(headed, lanes, ids)
    split, _ = prefilled(headed, lanes, ids)
    want = head.absorb([Absorb(whole, 0, rows, ids[1:], DRAFTS)])
    cut = 17
    head.absorb([Absorb(split, 0, rows[:cut], ids[1:cut + 1], DRAFTS)])
    got = head.absorb([Absorb(split, cut, rows[cut:], ids[cut + 1:], DRAFTS)])
    assert got == want and len(want[0]) == DRAFTS


def test_the_confidence_cut_and_the_asked_count_bound_the_chain(headed: HybridModel, lanes: LanePool) -> None:
    ids = prompt()
    lane, rows = prefilled(headed, lanes, ids)
    every = proposer(headed, lanes, 0.0).absorb([Absorb(lane, 0, rows, ids[1:], DRAFTS)])
    assert len(every[0]) == DRAFTS
    first = proposer(headed, lanes, 1.5).absorb([Absorb(lane, 0, rows, ids[1:], DRAFTS)])
    assert first == [every[0][:1]]  # nothing is that sure: the first draft alone, the same one
    two = proposer(headed, lanes, 0.0)
    assert two.absorb([Absorb(lane, 0, rows, ids[1:], 2), Absorb(lane, 0, rows, ids[1:], 0)]) == \
        [every[0][:2], []]


def test_a_cell_as_a_decode_row_is_the_span_cell(headed: HybridModel, lanes: LanePool) -> None:
    # a captured round runs the head's cells as decode rows; they are the formulas the span cells run
    ids = prompt()
    lane, rows = prefilled(headed, lanes, ids)
    spanned = headed.draft([Span(lane, 0, torch.tensor(ids[1:]))], rows, lanes.rows)
    head = proposer(headed, lanes, 0.0)
    at = len(ids) - 2
    base = head.base([Absorb(lane, 0, rows, ids[1:], 1)])
    base.packed[0] = ids[-1]
    decoded = headed.draft_rows(DecodeBatch(base.packed, base.columns), head.memory, rows[at:])
    torch.testing.assert_close(decoded.hidden[0], spanned.hidden[at], rtol=1e-4, atol=1e-4)

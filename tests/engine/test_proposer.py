"""Drafts from the MTP head: absorbed rows land at their positions, chains stop where they should."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tiny_models
import torch

from tfd.checkpoint import Checkpoint
from tfd.engine.proposer import Absorb, HeadProposer
from tfd.families.hybrid import HybridModel, load_model
from tfd.generate import LanePool
from tfd.model.memory import LaneMemory, Span

PROMPT = 40
DRAFTS = 4


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_next"])
def headed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> HybridModel:
    path: Path = tiny_models.save(str(request.param), tmp_path_factory.mktemp("head"))
    tiny_models.add_head(path, str(request.param))
    return load_model(Checkpoint.open(path), dtype=torch.float32, progress=False)


@pytest.fixture
def lanes(headed: HybridModel) -> Iterator[LanePool]:
    pool = LanePool(headed, PROMPT + 2 * DRAFTS, lanes=2, page_rows=8, head=True)
    yield pool
    pool.close()


def prompt() -> list[int]:
    generator = torch.Generator().manual_seed(5)
    return torch.randint(8, tiny_models.VOCAB, (PROMPT + 1,), generator=generator).tolist()


def prefilled(headed: HybridModel, lanes: LanePool, ids: list[int]) -> tuple[LaneMemory, torch.Tensor]:
    """A lane with the prompt ``ids[:-1]`` prefilled, and the main model's rows for it."""
    lane = lanes.open()
    out = lanes.forward([Span(lane, 0, torch.tensor(ids[:-1]))])
    return lane, headed.draft_input(out)


def test_rows_absorbed_in_one_piece_or_two_give_the_same_drafts(headed: HybridModel, lanes: LanePool) -> None:
    # the head's rows are written at their positions: absorbing the prompt in two pieces (the first
    # chaining drafts whose speculative rows the second overwrites) leaves what one piece leaves
    ids = prompt()
    proposer = HeadProposer(headed, lanes.rows, confidence=0.0)
    whole, rows = prefilled(headed, lanes, ids)
    split, _ = prefilled(headed, lanes, ids)
    want = proposer.propose([Absorb(whole, 0, rows, ids[1:], DRAFTS)])
    cut = 17
    proposer.propose([Absorb(split, 0, rows[:cut], ids[1:cut + 1], DRAFTS)])
    got = proposer.propose([Absorb(split, cut, rows[cut:], ids[cut + 1:], DRAFTS)])
    assert got == want and len(want[0]) == DRAFTS


def test_the_confidence_cut_and_the_asked_count_bound_the_chain(headed: HybridModel, lanes: LanePool) -> None:
    ids = prompt()
    lane, rows = prefilled(headed, lanes, ids)
    every = HeadProposer(headed, lanes.rows, confidence=0.0).propose([Absorb(lane, 0, rows, ids[1:], DRAFTS)])
    assert len(every[0]) == DRAFTS
    first = HeadProposer(headed, lanes.rows, confidence=1.5).propose([Absorb(lane, 0, rows, ids[1:], DRAFTS)])
    assert first == [every[0][:1]]  # nothing is that sure: the first draft alone, the same one
    two = HeadProposer(headed, lanes.rows, confidence=0.0)
    assert two.propose([Absorb(lane, 0, rows, ids[1:], 2), Absorb(lane, 0, rows, ids[1:], 0)]) == \
        [every[0][:2], []]

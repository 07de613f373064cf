"""QSA's choice in one launch against ``tfd.model.qsa.choose``'s torch sorts: the same positions and
counts, bit for bit, for rows with fewer, as many and more complete blocks than the budget holds,
ties, blocks of 2, 3 (not a power of two) and 4, row lengths that are and are not powers of two,
and a row alone as in a batch."""

from __future__ import annotations

import pytest
import torch

from tfd.model import qsa
from tfd.model.qsa import IndexerWeights
from tfd_kernels import block_choice


def indexer(budget: int, block: int) -> IndexerWeights:
    return IndexerWeights(qk=torch.zeros(1, 1), q_norm=torch.zeros(1), k_norm=torch.zeros(1), heads=1,
                          dim=1, budget=budget, block=block, eps=1e-6)


def scores_at(positions: torch.Tensor, blocks: int, block: int, seed: int, levels: int | None
              ) -> torch.Tensor:
    """Scores [rows, blocks], -inf from each row's first incomplete block; ``levels``: drawn from that
    many values, so ties are common."""
    g = torch.Generator().manual_seed(seed)
    drawn = torch.rand(positions.shape[0], blocks, generator=g)
    if levels is not None:
        drawn = torch.floor(drawn * levels) / levels
    complete = (positions + 1) // block
    return torch.where(torch.arange(blocks)[None, :] < complete[:, None], drawn, float("-inf"))


@pytest.mark.parametrize(("budget", "block"), [(8, 2), (12, 3), (16, 4), (4, 4)])
@pytest.mark.parametrize("blocks", [16, 24, 64])
@pytest.mark.parametrize("levels", [None, 3])
def test_the_launch_chooses_what_the_sorts_choose(budget: int, block: int, blocks: int,
                                                  levels: int | None) -> None:
    w = indexer(budget, block)
    # each side of a block's end, of the budget's and of the last position the row's blocks hold
    edges = [0, block - 1, block, budget - 1, budget, budget + block - 1, budget + block, blocks * block - 1]
    inside = {p for p in edges if 0 <= p < blocks * block} | {blocks * block // 2 + 1}
    positions = torch.tensor(sorted(inside))
    scored = scores_at(positions, blocks, block, seed=blocks + block, levels=levels)
    want = qsa.choose(w, scored, positions, blocks * block + block)
    got = block_choice.choose(scored, positions, budget // block, block)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    kept = torch.clamp((positions + 1) // block, max=budget // block) * block
    assert torch.equal(got[1], (kept + (positions + 1) % block).to(torch.int32))  # both sides of the budget


def test_a_row_alone_is_the_row_in_a_batch_and_zeros_of_either_sign_tie() -> None:
    positions = torch.tensor([40, 63, 7, 0])
    scored = scores_at(positions, 16, 4, seed=1, levels=2)
    scored[0, :3] = torch.tensor([0.0, -0.0, 0.0])  # -0.0 is a tie with 0.0, as torch's sort has it
    together = block_choice.choose(scored, positions, 4, 4)
    for row in range(4):
        alone = block_choice.choose(scored[row:row + 1], positions[row:row + 1], 4, 4)
        assert torch.equal(alone[0][0], together[0][row]) and alone[1][0] == together[1][row]
    assert torch.equal(together[0], qsa.choose(indexer(16, 4), scored, positions, 100)[0])


def test_scores_of_another_dtype_or_a_budget_of_no_block_are_refused() -> None:
    with pytest.raises(ValueError, match=r"scores torch\.float64 \[1, 8\]"):
        block_choice.choose(torch.zeros(1, 8, dtype=torch.float64), torch.zeros(1, dtype=torch.long), 4, 4)
    with pytest.raises(ValueError, match="best 0 of blocks of 4"):
        block_choice.choose(torch.zeros(1, 8), torch.zeros(1, dtype=torch.long), 0, 4)


@pytest.mark.gpu
# a 4,096-token lane's page table; the most a program sorts; a 32k prompt's 8,256 and 64k's, by passes
@pytest.mark.parametrize("blocks", [1024, 8192, 8256, 16384])
# a long row's passes at either chunk (33 rows: a decode step's call)
@pytest.mark.parametrize(("chunk", "warps"), [(2048, 8), (4096, 16)])
def test_on_the_gpu_the_launch_chooses_what_the_sorts_choose(blocks: int, chunk: int, warps: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(block_choice, "LONG_CHUNK", chunk)
    monkeypatch.setattr(block_choice, "LONG_WARPS", warps)
    positions = torch.randint(0, blocks * 4, (33,), device="cuda")
    positions[:3] = torch.tensor([2046, 2047, 2051], device="cuda")  # complete blocks under, at, past 512
    scored = scores_at(positions.cpu(), blocks, 4, seed=7, levels=5).cuda()
    want = qsa.choose(indexer(2048, 4), scored, positions, blocks * 4 + 4)
    got = block_choice.choose(scored, positions, 512, 4)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("most", [16, 63, 64])  # rows of 64 blocks: past what a program sorts, by one, not
@pytest.mark.parametrize(("budget", "block"), [(8, 2), (12, 3), (16, 4)])
@pytest.mark.parametrize("levels", [None, 3])
def test_rows_past_what_a_program_sorts_choose_the_same_by_passes(most: int, budget: int, block: int,
                                                                  levels: int | None) -> None:
    """The radix select of a long row (its chunks of LONG_CHUNK blocks cut small to cross them): the
    sorts' positions, with fewer complete blocks than the budget, as many, more, and ties."""
    w, blocks = indexer(budget, block), 64
    last = blocks * block - 1
    positions = torch.tensor([0, block - 1, block, budget - 1, budget, budget + block, last // 2 + 1, last])
    scored = scores_at(positions, blocks, block, seed=11 + block, levels=levels)
    scored[-1, :6] = torch.tensor([0.0, -0.0, 0.0, 0.5, -0.0, 0.5])  # zeros of either sign tie
    want = qsa.choose(w, scored, positions, blocks * block + block)
    chunk = block_choice.LONG_CHUNK
    try:
        block_choice.LONG_CHUNK = 16  # several passes' chunks in a row of 64
        got = block_choice.choose(scored, positions, budget // block, block, most=most)
    finally:
        block_choice.LONG_CHUNK = chunk
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(got[0], block_choice.choose(scored, positions, budget // block, block)[0])

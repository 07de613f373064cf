"""QSA's selection: the best complete blocks, ties to the lower block, and the open tail."""

from __future__ import annotations

import torch

from tfd.families.lane_state import AttentionRows
from tfd.model.memory import LaneMemory, PageRows, Span
from tfd.model.qsa import IndexerWeights, select
from tfd.model.rope import Rotary
from tfd.pool.layout import Layout
from tfd.pool.pages import Pool

DIM, HEADS, BUDGET, BLOCK = 8, 2, 8, 4  # two blocks chosen at most


def setup(query_weights: torch.Tensor, key_weights: torch.Tensor, length: int) -> list[torch.Tensor]:
    rows = AttentionRows(["a"], kv_heads=1, head_dim=DIM, dtype="float32", index_dim=DIM).parts()
    pool = Pool(Layout(16, rows, []), 8)
    lease = pool.promise(length)
    lease.take(length)
    weights = IndexerWeights(qk=torch.cat((query_weights, key_weights)), q_norm=torch.zeros(DIM),
                             k_norm=torch.zeros(DIM), heads=HEADS, dim=DIM, budget=BUDGET, block=BLOCK,
                             eps=1e-6)
    x = torch.randn(length, 5, generator=torch.Generator().manual_seed(3))
    span = Span(LaneMemory({}, lease.page_table), 0, torch.zeros(length, dtype=torch.long))
    rotary = Rotary.of(DIM, 0.5, 10000.0)
    cos, sin = rotary.angles(torch.arange(length), torch.float32)
    return select(weights, x, span, PageRows(pool), "a", rotary, cos, sin)


def test_equal_scores_go_to_the_lower_blocks_and_the_tail_is_kept() -> None:
    # Zero index queries: every block scores 0, a tie all the way down.
    chosen = setup(torch.zeros(HEADS * DIM, 5), torch.randn(DIM, 5), 23)
    assert chosen[6].tolist() == [0, 1, 2, 3, 4, 5, 6]  # one complete block and the tail
    assert chosen[14].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14]  # blocks 0, 1 of 3; tail 12..14
    assert chosen[19].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]  # five blocks complete, no tail
    assert chosen[22].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 20, 21, 22]


def test_the_best_blocks_win() -> None:
    generator = torch.Generator().manual_seed(0)
    chosen = setup(torch.randn(HEADS * DIM, 5, generator=generator),
                   torch.randn(DIM, 5, generator=generator), 40)
    for position, picked in enumerate(chosen):
        complete = (position + 1) // BLOCK
        blocks = sorted({p // BLOCK for p in picked.tolist() if p < complete * BLOCK})
        assert len(blocks) == min(BUDGET // BLOCK, complete)
        assert picked.tolist() == sorted(picked.tolist())
        tail = [p for p in picked.tolist() if p >= complete * BLOCK]
        assert tail == list(range(complete * BLOCK, position + 1))

"""QSA's selection: the best complete blocks, ties to the lower block, and the open tail."""

from __future__ import annotations

import torch

from tfd.families.lane_state import AttentionRows
from tfd.model.memory import LaneMemory, PageRows, Span
from tfd.model.qsa import IndexerWeights, select, select_positions
from tfd.model.rope import Rotary
from tfd.pool.layout import Layout
from tfd.pool.pages import Pool

DIM, HEADS, BUDGET, BLOCK = 8, 2, 8, 4  # two blocks chosen at most


def setup(query_weights: torch.Tensor, key_weights: torch.Tensor, length: int, batched: bool = False,
          start: int = 0) -> list[torch.Tensor]:
    """Each position's chosen positions: by ``select``, or by ``select_positions`` (``batched``) for
    the rows from ``start`` after the rows before it went through ``select``."""
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
    if not batched:
        return select(weights, x, span, PageRows(pool), "a", rotary, cos, sin)
    rows = PageRows(pool)
    before, after = Span(span.lane, 0, span.tokens[:start]), Span(span.lane, start, span.tokens[start:])
    first = select(weights, x[:start], before, rows, "a", rotary, cos[:start], sin[:start]) if start else []
    positions, counts = select_positions(weights, x[start:], after, rows, "a", rotary, cos[start:],
                                         sin[start:])
    return first + [row[:int(n)].long() for row, n in zip(positions, counts, strict=True)]


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


def test_all_rows_at_once_choose_what_each_row_chooses() -> None:
    generator = torch.Generator().manual_seed(0)
    query, key = torch.randn(HEADS * DIM, 5, generator=generator), torch.randn(DIM, 5, generator=generator)
    alone = setup(query, key, 40)
    for start in (0, 9, 20):  # a whole prompt, and a later chunk over blocks already pooled
        together = setup(query, key, 40, batched=True, start=start)
        assert [row.tolist() for row in together] == [row.tolist() for row in alone]
    zero = torch.zeros(HEADS * DIM, 5)
    ties, want = setup(zero, key, 23, batched=True), setup(zero, key, 23)
    assert [row.tolist() for row in ties] == [row.tolist() for row in want]

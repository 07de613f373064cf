"""QSA's selection: the best complete blocks, ties to the lower block, and the open tail; a prompt
in chunks and a batched decode step choose what a row-by-row transcription of model.md 3.4 does."""

from __future__ import annotations

import itertools
import math

import torch

from tfd.families.lane_state import AttentionRows
from tfd.model.memory import LaneMemory, PageRows, Span
from tfd.model.ops import zrms
from tfd.model.qsa import IndexerWeights, select_positions, select_rows
from tfd.model.rope import Rotary
from tfd.pool.layout import Layout
from tfd.pool.pages import Pool

DIM, HEADS, BUDGET, BLOCK, HIDDEN = 8, 2, 8, 4, 5  # two blocks chosen at most
ROTARY = Rotary.of(DIM, 0.5, 10000.0)


def indexer(query_weights: torch.Tensor, key_weights: torch.Tensor) -> IndexerWeights:
    g = torch.Generator().manual_seed(5)
    q_norm, k_norm = 0.2 * torch.randn(DIM, generator=g), 0.2 * torch.randn(DIM, generator=g)
    return IndexerWeights(qk=torch.cat((query_weights, key_weights)), q_norm=q_norm, k_norm=k_norm,
                          heads=HEADS, dim=DIM, budget=BUDGET, block=BLOCK, eps=1e-6)


def rows_of(length: int, seed: int = 3) -> torch.Tensor:
    return torch.randn(length, HIDDEN, generator=torch.Generator().manual_seed(seed))


def reference(w: IndexerWeights, x: torch.Tensor) -> list[list[int]]:
    """model.md 3.4 a row at a time: every position's chosen positions."""
    cos, sin = ROTARY.angles(torch.arange(x.shape[0]), x.dtype)
    projected = x @ w.qk.T
    queries = ROTARY.apply(zrms(projected[:, :HEADS * DIM].view(-1, HEADS, DIM), w.q_norm, w.eps), cos, sin)
    raw = projected[:, HEADS * DIM:]
    chosen = []
    for position in range(x.shape[0]):
        complete = (position + 1) // BLOCK
        pooled = torch.stack([raw[b * BLOCK:(b + 1) * BLOCK].mean(dim=0) for b in range(complete)]) \
            if complete else torch.empty(0, DIM)
        block_cos, block_sin = ROTARY.angles(torch.arange(complete) * BLOCK, x.dtype)
        pooled = ROTARY.apply(zrms(pooled, w.k_norm, w.eps)[:, None, :], block_cos, block_sin)[:, 0]
        scores = torch.relu(queries[position] @ pooled.T).sum(dim=0) / math.sqrt(DIM)
        best = torch.sort(scores, descending=True, stable=True).indices[:BUDGET // BLOCK].sort().values
        picked = [int(b) * BLOCK + i for b in best for i in range(BLOCK)]
        chosen.append(picked + list(range(complete * BLOCK, position + 1)))
    return chosen


def lane_pool(lanes: int, length: int) -> tuple[Pool, list[LaneMemory]]:
    rows = AttentionRows(["a"], kv_heads=1, head_dim=DIM, dtype="float32", index_dim=DIM, block=BLOCK)
    parts = rows.parts()
    pool = Pool(Layout(16, parts, []), 8 * lanes)
    memories = []
    for _ in range(lanes):
        lease = pool.promise(length)
        lease.take(length)
        memories.append(LaneMemory({}, lease.page_table))
    return pool, memories


def in_chunks(w: IndexerWeights, x: torch.Tensor, cuts: list[int], rows: PageRows, lane: LaneMemory
              ) -> list[list[int]]:
    """``select_positions`` over the chunks of ``x`` cut at ``cuts``: each row's positions."""
    chosen = []
    bounds = [0, *cuts, x.shape[0]]
    for start, end in itertools.pairwise(bounds):
        if end == start:
            continue
        cos, sin = ROTARY.angles(torch.arange(start, end), x.dtype)
        span = Span(lane, start, torch.zeros(end - start, dtype=torch.long))
        positions, counts = select_positions(w, x[start:end], span, rows, "a", ROTARY, cos, sin)
        chosen += [row[:int(n)].tolist() for row, n in zip(positions, counts, strict=True)]
    return chosen


def test_equal_scores_go_to_the_lower_blocks_and_the_tail_is_kept() -> None:
    # Zero index queries: every block scores 0, a tie all the way down.
    w = indexer(torch.zeros(HEADS * DIM, HIDDEN), torch.randn(DIM, HIDDEN))
    pool, (lane,) = lane_pool(1, 23)
    chosen = in_chunks(w, rows_of(23), [], PageRows(pool), lane)
    assert chosen[6] == [0, 1, 2, 3, 4, 5, 6]  # one complete block and the tail
    assert chosen[14] == [0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14]  # blocks 0, 1 of 3; tail 12..14
    assert chosen[19] == [0, 1, 2, 3, 4, 5, 6, 7]  # five blocks complete, no tail
    assert chosen[22] == [0, 1, 2, 3, 4, 5, 6, 7, 20, 21, 22]
    assert chosen == reference(w, rows_of(23))


def test_the_best_blocks_win_in_one_pass_and_in_chunks() -> None:
    generator = torch.Generator().manual_seed(0)
    w = indexer(torch.randn(HEADS * DIM, HIDDEN, generator=generator),
                torch.randn(DIM, HIDDEN, generator=generator))
    want = reference(w, rows_of(40))
    for cuts in ([], [9], [20, 21, 30]):  # a whole prompt, later chunks over blocks already pooled
        pool, (lane,) = lane_pool(1, 40)
        assert in_chunks(w, rows_of(40), cuts, PageRows(pool), lane) == want
    for position, picked in enumerate(want):  # the reference itself: the budget's blocks, then the tail
        complete = (position + 1) // BLOCK
        blocks = sorted({p // BLOCK for p in picked if p < complete * BLOCK})
        assert len(blocks) == min(BUDGET // BLOCK, complete)
        assert [p for p in picked if p >= complete * BLOCK] == list(range(complete * BLOCK, position + 1))


def test_a_decode_step_of_many_lanes_chooses_and_stores_as_each_lane_alone() -> None:
    """Lanes at positions 10, 11 (completing a block), 23 (completing one past the budget) and 30,
    with a padding lane among them: one ``select_rows`` call against ``select_positions`` of one row
    per lane; the same positions and the same pool bytes (index keys, pooled blocks)."""
    generator = torch.Generator().manual_seed(1)
    w = indexer(torch.randn(HEADS * DIM, HIDDEN, generator=generator),
                torch.randn(DIM, HIDDEN, generator=generator))
    starts = [10, 11, 23, 30]
    x = [rows_of(start + 1, seed=10 + i) for i, start in enumerate(starts)]
    pools = []
    for _ in range(2):  # both pools prefilled alike, each lane up to its decode row
        pool, lanes = lane_pool(len(starts), 32)
        rows = PageRows(pool)
        for lane, start, lane_x in zip(lanes, starts, x, strict=True):
            in_chunks(w, lane_x[:start], [], rows, lane)
        pools.append((pool, lanes, rows))
    (alone_pool, alone_lanes, alone_rows), (batch_pool, batch_lanes, batch_rows) = pools
    want = [in_chunks(w, lane_x, [start], alone_rows, lane)[start]
            for lane, start, lane_x in zip(alone_lanes, starts, x, strict=True)]

    padding = 2  # the padding lane's column: no keys, every page the null page
    table = torch.stack([lane.page_table for lane in batch_lanes])
    table = torch.cat((table[:padding], torch.full_like(table[:1], batch_pool.null_page), table[padding:]))
    lengths = torch.tensor([*[s + 1 for s in starts[:padding]], 0, *[s + 1 for s in starts[padding:]]])
    rows_x = torch.stack([lane_x[-1] for lane_x in x])
    rows_x = torch.cat((rows_x[:padding], torch.randn(1, HIDDEN), rows_x[padding:]))
    cos, sin = ROTARY.angles((lengths - 1).clamp_min(0), rows_x.dtype)
    positions, counts = select_rows(w, rows_x, ROTARY, cos, sin, batch_rows.views["a.index"],
                                    batch_rows.views["a.pooled"], table, lengths)
    got = [row[:int(n)].tolist() for row, n in zip(positions, counts, strict=True)]
    assert got[padding] == [0]
    assert got[:padding] + got[padding + 1:] == want
    assert torch.equal(batch_pool.buffer, alone_pool.buffer)  # the null page stayed zero too

"""QSA's selection: the best complete blocks, ties to the lower block, and the open tail; a prompt
in chunks and a batched decode step choose what a row-by-row transcription of model.md 3.4 does,
and what transformers' own indexer does past the budget, with the block-score kernel too."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import tfd.model.qsa as qsa
from tfd.families.lane_state import AttentionRows
from tfd.model.memory import LaneMemory, PageRows, Span
from tfd.model.ops import zrms
from tfd.model.qsa import IndexerWeights, decode_rows, select_positions, select_rows
from tfd.model.rope import Rotary
from tfd.pool.layout import Layout
from tfd.pool.pages import Pool
from tfd_kernels import block_scores, sparse_attention

DIM, HEADS, BUDGET, BLOCK, HIDDEN = 8, 2, 8, 4, 5  # two blocks chosen at most
ROTARY = Rotary.of(DIM, 0.5, 10000.0)


def indexer(query_weights: torch.Tensor, key_weights: torch.Tensor) -> IndexerWeights:
    g = torch.Generator().manual_seed(5)
    q_norm, k_norm = 0.2 * torch.randn(DIM, generator=g), 0.2 * torch.randn(DIM, generator=g)
    return IndexerWeights(qk=torch.cat((query_weights, key_weights)), q_norm=q_norm, k_norm=k_norm,
                          heads=HEADS, dim=DIM, budget=BUDGET, block=BLOCK, eps=1e-6)


def rows_of(length: int, seed: int = 3) -> torch.Tensor:
    return torch.randn(length, HIDDEN, generator=torch.Generator().manual_seed(seed))


def reference(w: IndexerWeights, x: torch.Tensor, rotary: Rotary = ROTARY) -> list[list[int]]:
    """model.md 3.4 a row at a time: every position's chosen positions."""
    cos, sin = rotary.angles(torch.arange(x.shape[0]), x.dtype)
    projected = x @ w.qk.T
    query = projected[:, :w.heads * w.dim].view(-1, w.heads, w.dim)
    queries = rotary.apply(zrms(query, w.q_norm, w.eps), cos, sin)
    raw = projected[:, w.heads * w.dim:]
    chosen = []
    for position in range(x.shape[0]):
        complete = (position + 1) // w.block
        pooled = torch.stack([raw[b * w.block:(b + 1) * w.block].mean(dim=0) for b in range(complete)]) \
            if complete else torch.empty(0, w.dim)
        block_cos, block_sin = rotary.angles(torch.arange(complete) * w.block, x.dtype)
        pooled = rotary.apply(zrms(pooled, w.k_norm, w.eps)[:, None, :], block_cos, block_sin)[:, 0]
        scores = torch.relu(queries[position] @ pooled.T).sum(dim=0) / math.sqrt(w.dim)
        best = torch.sort(scores, descending=True, stable=True).indices[:w.budget // w.block].sort().values
        picked = [int(b) * w.block + i for b in best for i in range(w.block)]
        chosen.append(picked + list(range(complete * w.block, position + 1)))
    return chosen


def lane_pool(lanes: int, length: int, dim: int = DIM, block: int = BLOCK) -> tuple[Pool, list[LaneMemory]]:
    rows = AttentionRows(["a"], kv_heads=1, head_dim=dim, dtype="float32", index_dim=dim, block=block)
    parts = rows.parts()
    pool = Pool(Layout(16, parts, []), 8 * lanes)
    memories = []
    for _ in range(lanes):
        lease = pool.promise(length)
        lease.take(length)
        memories.append(LaneMemory({}, lease.page_table))
    return pool, memories


def in_chunks(w: IndexerWeights, x: torch.Tensor, cuts: list[int], rows: PageRows, lane: LaneMemory,
              rotary: Rotary = ROTARY) -> list[list[int]]:
    """``select_positions`` over the chunks of ``x`` cut at ``cuts``: each row's positions."""
    chosen = []
    bounds = [0, *cuts, x.shape[0]]
    for start, end in itertools.pairwise(bounds):
        if end == start:
            continue
        cos, sin = rotary.angles(torch.arange(start, end), x.dtype)
        span = Span(lane, start, torch.zeros(end - start, dtype=torch.long))
        positions, counts = select_positions(w, x[start:end], span, rows, "a", rotary, cos, sin)
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


@pytest.mark.parametrize("cuts", [[], [13]])
def test_a_span_scored_in_slices_of_rows_chooses_as_in_one(monkeypatch: pytest.MonkeyPatch,
                                                           cuts: list[int]) -> None:
    """A long chunk's rows are scored SCORED_ROWS at a time (the scores grow with rows x blocks):
    spans under, at and past a slice of 8 rows, and over several, choose as one slice does."""
    generator = torch.Generator().manual_seed(1)
    w = indexer(torch.randn(HEADS * DIM, HIDDEN, generator=generator),
                torch.randn(DIM, HIDDEN, generator=generator))
    want = reference(w, rows_of(40))
    for length in (7, 8, 9, 40):
        monkeypatch.setattr(qsa, "SCORED_ROWS", 8)
        pool, (lane,) = lane_pool(1, 40)
        assert in_chunks(w, rows_of(40)[:length], [c for c in cuts if c < length], PageRows(pool), lane) \
            == want[:length]


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
                                    batch_rows.views["a.pooled"], table, decode_rows(lengths))
    got = [row[:int(n)].tolist() for row, n in zip(positions, counts, strict=True)]
    assert got[padding] == [0]
    assert got[:padding] + got[padding + 1:] == want
    assert torch.equal(batch_pool.buffer, alone_pool.buffer)  # the null page stayed zero too


PAST = [(8, 2), (8, 4), (16, 2), (16, 4), (32, 4)]  # (budget, block): contexts run to past twice the budget
WIDE_DIM, WIDE_HEADS, WIDE_HIDDEN = 16, 8, 32  # the tiny checkpoints' index heads: 8 of 16, rotary on 8
WIDE_ROTARY = Rotary.of(WIDE_DIM, 0.5, 10000.0)


def wide_indexer(budget: int, block: int, seed: int) -> IndexerWeights:
    g = torch.Generator().manual_seed(seed)
    return IndexerWeights(qk=torch.randn((WIDE_HEADS + 1) * WIDE_DIM, WIDE_HIDDEN, generator=g),
                          q_norm=0.3 * torch.randn(WIDE_DIM, generator=g),
                          k_norm=0.3 * torch.randn(WIDE_DIM, generator=g), heads=WIDE_HEADS, dim=WIDE_DIM,
                          budget=budget, block=block, eps=1e-6)


def transformers_choice(w: IndexerWeights, x: torch.Tensor, rotary: Rotary) -> list[list[int]]:
    """transformers' own ``Qwen4ExpTextQSAIndexer`` given ``w``'s weights, over the causal rows of
    ``x``: each row's positions."""
    from types import SimpleNamespace

    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextQSAIndexer

    config = SimpleNamespace(hidden_size=x.shape[1], indexer_n_heads=w.heads, indexer_kv_heads=1,
                             indexer_head_dim=w.dim, indexer_budget=w.budget, indexer_compress_ratio=w.block,
                             rms_norm_eps=w.eps)
    module = Qwen4ExpTextQSAIndexer(config, 0)
    n = x.shape[0]
    cos, sin = rotary.angles(torch.arange(n), x.dtype)
    causal = torch.full((n, n), torch.finfo(x.dtype).min).triu(1)[None, None]  # eager's float mask
    with torch.no_grad():
        module.index_qk_proj.weight.copy_(w.qk)
        module.q_layernorm.weight.copy_(w.q_norm)
        module.k_layernorm.weight.copy_(w.k_norm)
        mask = module(x[None], (cos[None], sin[None]), causal, None)[0, 0]
    return [row.nonzero().flatten().tolist() for row in mask]


def kernel_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The block-score kernel (the interpreter on the CPU) in place of its torch reference."""
    monkeypatch.setattr(qsa, "scores", lambda *args: block_scores.scores(*args))


@pytest.mark.parametrize(("budget", "block"), PAST)
@pytest.mark.parametrize("scoring", ["reference", "kernel"])
def test_transformers_indexer_chooses_the_same_positions_past_the_budget(
        budget: int, block: int, scoring: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row of a prompt over twice the budget: what transformers' indexer selects, in one pass
    and in chunks cut around the budget, scored by the reference or the kernel; the budget binds."""
    if scoring == "kernel":
        kernel_scores(monkeypatch)
    w = wide_indexer(budget, block, seed=budget + block)
    length = 2 * budget + 3 * block + 1
    x = torch.randn(length, WIDE_HIDDEN, generator=torch.Generator().manual_seed(7))
    want = transformers_choice(w, x, WIDE_ROTARY)
    assert reference(w, x, WIDE_ROTARY) == want
    assert any(len(picked) < position + 1 for position, picked in enumerate(want))  # some row loses keys
    assert all(len(picked) <= budget + block - 1 for picked in want)
    for cuts in ([], [budget - 1, budget + block], [block + 1, budget + block - 1, 2 * budget]):
        pool, (lane,) = lane_pool(1, length, WIDE_DIM, block)
        assert in_chunks(w, x, cuts, PageRows(pool), lane, WIDE_ROTARY) == want, cuts


@pytest.mark.parametrize(("budget", "block"), PAST)
def test_rows_before_the_whole_prefix_choose_every_position_up_to_theirs(budget: int, block: int) -> None:
    """``whole_prefix``: the rows there the GPU's prompt path attends as dense rows choose every position
    up to their own; the row at it is the first to lose one. ``select_positions`` from a row on gives
    the rows from it."""
    w = wide_indexer(budget, block, seed=budget * block)
    prefix = qsa.whole_prefix(w)
    x = torch.randn(prefix + 2 * block, WIDE_HIDDEN, generator=torch.Generator().manual_seed(9))
    want = reference(w, x, WIDE_ROTARY)
    assert all(want[p] == list(range(p + 1)) for p in range(prefix))
    assert len(want[prefix]) == budget < prefix + 1  # its blocks complete, one left out; no tail
    pool, (lane,) = lane_pool(1, x.shape[0], WIDE_DIM, block)
    rows = PageRows(pool)
    cos, sin = WIDE_ROTARY.angles(torch.arange(x.shape[0]), x.dtype)
    span = Span(lane, 0, torch.zeros(x.shape[0], dtype=torch.long))
    for first in (prefix, x.shape[0]):
        positions, counts = select_positions(w, x, span, rows, "a", WIDE_ROTARY, cos, sin, from_row=first)
        assert [row[:int(n)].tolist() for row, n in zip(positions, counts, strict=True)] == want[first:]


@pytest.mark.parametrize(("budget", "block"), [(8, 2), (16, 4)])
def test_a_decode_step_past_the_budget_chooses_as_transformers_with_the_kernels(
        budget: int, block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``select_rows`` (block scores by the kernel) for lanes at rows just under, at and well past
    the budget, against transformers' indexer; then the sparse kernel over those positions
    attends as its reference."""
    kernel_scores(monkeypatch)
    w = wide_indexer(budget, block, seed=3 * budget + block)
    starts = [budget - 2, budget + block - 1, 2 * budget + 1]  # each lane's decode row
    x = [torch.randn(start + 1, WIDE_HIDDEN, generator=torch.Generator().manual_seed(20 + i))
         for i, start in enumerate(starts)]
    want = [transformers_choice(w, lane_x, WIDE_ROTARY)[start]
            for start, lane_x in zip(starts, x, strict=True)]
    pool, lanes = lane_pool(len(starts), 2 * budget + 2, WIDE_DIM, block)
    rows = PageRows(pool)
    for lane, start, lane_x in zip(lanes, starts, x, strict=True):
        in_chunks(w, lane_x[:start], [], rows, lane, WIDE_ROTARY)
    lengths = torch.tensor([start + 1 for start in starts])
    cos, sin = WIDE_ROTARY.angles(lengths - 1, torch.float32)
    table = torch.stack([lane.page_table for lane in lanes])
    last = torch.stack([lane_x[-1] for lane_x in x])
    positions, counts = select_rows(w, last, WIDE_ROTARY, cos, sin, rows.views["a.index"],
                                    rows.views["a.pooled"], table, decode_rows(lengths))
    assert [row[:int(n)].tolist() for row, n in zip(positions, counts, strict=True)] == want
    assert int(counts[-1]) < starts[-1] + 1  # the last lane lost keys

    g = torch.Generator().manual_seed(1)
    keys = torch.randn(int(table.max()) + 1, 16, 2, 8, generator=g)  # [pages, page rows, kv heads, d]
    values = torch.randn(keys.shape, generator=g)
    query = torch.randn(len(starts), 4, 8, generator=g)
    lane_of = torch.arange(len(starts), dtype=torch.int32)
    args = (query, keys, values, table, lane_of, positions, counts, 8 ** -0.5)
    assert torch.allclose(sparse_attention.attend(*args, torch.empty_like(query)),
                          sparse_attention.reference(*args, torch.empty_like(query)), rtol=1e-5, atol=1e-6)


def test_the_index_keys_norm_and_rotation_in_one_launch_are_torchs() -> None:
    """On CUDA the index queries and pooled keys are normed and rotated by attention's one-launch
    kernel: here interpreted against the torch path, for queries of several heads and a pooled key's
    one-head view."""
    from tfd_kernels import rope as rope_kernel

    g = torch.Generator().manual_seed(9)
    weight = 0.2 * torch.randn(DIM, generator=g)
    cos, sin = ROTARY.angles(torch.arange(20, 26), torch.float32)
    for x in (torch.randn(6, HEADS, DIM, generator=g), torch.randn(6, DIM, generator=g)[:, None, :]):
        want = ROTARY.apply(zrms(x, weight, 1e-6), cos, sin)
        assert torch.allclose(rope_kernel.norm_rope(x, weight, cos, sin, 1e-6), want, atol=1e-6)

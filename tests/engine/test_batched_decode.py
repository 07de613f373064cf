"""Flash Next's decode rows in one batched pass (``run_decode``) give the bits of the span path.

The exactness contract: a lane's tokens must not depend on which path or batch ran it. Lanes at
different positions, crossing pages and QSA block boundaries, a padding lane among them, EOS in the
n-gram context: each step's head rows and every pool byte (GDN states and conv tails, PLE tail and
n-gram history, K/V, raw index keys, pooled blocks, the null page) against the same rows run as
decode spans. Then the engine's runner: the same requests with the batched path on and off.
"""

from __future__ import annotations

import numpy as np
import pytest
import tiny_models
import torch

from support import CACHE
from tfd.bench.workload import drive
from tfd.checkpoint import Checkpoint
from tfd.engine import runner
from tfd.engine.request import Request, Sampling
from tfd.families.hybrid import HybridModel, load_model
from tfd.model.decode import DecodeMemory
from tfd.model.decode_batch import Columns, DecodeBatch
from tfd.model.memory import LaneMemory, PageRows, Span
from tfd.pool.pages import Lease, Pool

PROMPTS = (9, 18, 37)  # decode rows from 9, 18 and 37: blocks of 4 complete at 11, 19, 23, 39
STEPS = (6, 4, 6)  # the second lane stops early: later steps batch two lanes
PADDING = 1  # the padding lane's column in every step


@pytest.fixture(scope="module")
def model() -> HybridModel:
    path = tiny_models.save("qwen4_exp", CACHE / "tiny-plain")
    return load_model(Checkpoint.open(path), "cpu", torch.float32, progress=False)


class Lanes:
    """A pool of small pages (lanes cross several) with one opened lane a prompt, prefilled."""

    def __init__(self, model: HybridModel, prompts: list[torch.Tensor], window: int) -> None:
        layout = model.layout(model.layout(4).smallest_page_rows())
        self.pool = Pool(layout, len(prompts) * layout.need(window))
        self.rows = PageRows(self.pool)
        self.leases: list[Lease] = []
        self.memories: list[LaneMemory] = []
        for prompt in prompts:
            lease = self.pool.promise(window)
            pieces = lease.open(model.init_state)
            lease.take(window)
            self.leases.append(lease)
            self.memories.append(LaneMemory(pieces, lease.page_table))
            model.forward([Span(self.memories[-1], 0, prompt)], self.rows)


def test_decode_steps_equal_the_span_path_bit_for_bit(model: HybridModel) -> None:
    generator = torch.Generator().manual_seed(4)
    prompts = [torch.randint(8, tiny_models.VOCAB, (n,), generator=generator) for n in PROMPTS]
    tokens = torch.randint(8, tiny_models.VOCAB, (max(STEPS), len(PROMPTS)), generator=generator)
    tokens[1, 0] = tokens[2, 2] = tokens[3, 2] = tiny_models.EOS  # PLE's n-gram cut at decode
    window = max(PROMPTS) + max(STEPS)
    spans, batched = Lanes(model, prompts, window), Lanes(model, prompts, window)
    assert torch.equal(spans.pool.buffer, batched.pool.buffer)

    assert model.batches_decode
    memory = DecodeMemory(batched.pool, model.dtype)
    gdn = model.gdn_layers().layers
    columns = Columns(len(gdn), batched.pool.layout.row_pages(window), ple=True)
    null = batched.pool.null_page
    for step in range(max(STEPS)):
        live = [lane for lane, steps in enumerate(STEPS) if step < steps]
        want = model.forward([Span(spans.memories[lane], PROMPTS[lane] + step, tokens[step, lane:lane + 1],
                                   decode=True) for lane in live], spans.rows).hidden
        packed = [columns.column(int(tokens[step, lane]), PROMPTS[lane] + step, 0, 0.0, lane,
                                 memory.lane_offsets(batched.memories[lane].pieces, gdn, ple=True),
                                 batched.leases[lane].row_pages, null) for lane in live]
        packed.insert(PADDING, columns.padding(null))
        got = model.decode(DecodeBatch.of(packed, columns, batched.pool.buffer.device), memory)
        assert torch.equal(torch.cat((got[:PADDING], got[PADDING + 1:])), want), f"step {step}"
        assert torch.equal(batched.pool.buffer, spans.pool.buffer), f"step {step}"
    assert spans.pool.census().null_clean and batched.pool.census().null_clean


def test_the_runner_draws_the_same_tokens_and_leaves_the_same_pool_either_path(
        model: HybridModel, monkeypatch: pytest.MonkeyPatch) -> None:
    generator = torch.Generator().manual_seed(9)
    prompts = [torch.randint(8, tiny_models.VOCAB, (7 + 11 * i,), generator=generator) for i in range(4)]
    asked = [Request(f"r{i}", tuple(prompt.tolist()), 12 - 2 * i, Sampling(1.0, seed=60 + i))
             for i, prompt in enumerate(prompts)]
    pools: list[Pool] = []
    made = runner.Runner.__init__

    def keep_pool(self: runner.Runner, model: HybridModel, pool: Pool, *args: object,
                  **kwargs: object) -> None:
        pools.append(pool)
        made(self, model, pool, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(runner.Runner, "__init__", keep_pool)
    batched = drive(model, asked, 256, graphs=False).tokens
    monkeypatch.setattr(HybridModel, "batches_decode", property(lambda self: False))
    spanned = drive(model, asked, 256, graphs=False).tokens
    assert [len(tokens) for tokens in batched] == [12, 10, 8, 6]
    assert batched == spanned
    assert torch.equal(pools[0].buffer, pools[1].buffer)  # every lane's rows and state, after the last step


def test_columns_refuse_offsets_that_do_not_fit() -> None:
    columns = Columns(gdn_layers=2, pages=3, ple=True)
    with pytest.raises(ValueError, match="offsets"):
        columns.column(1, 0, 0, 1.0, 0, [0, 0, 0, 0], [5], null_page=9)  # the PLE pair left out
    plain = Columns(gdn_layers=2, pages=3)
    batch = DecodeBatch.of([plain.padding(9)], plain, torch.device("cpu"))
    with pytest.raises(ValueError, match="PLE"):
        _ = batch.ple_tail_at


@pytest.mark.parametrize("held", [0, 2, 3])  # no row page, some, every one the columns hold
def test_a_steps_inputs_packed_from_heads_and_kept_tails_are_its_columns(held: int) -> None:
    columns = Columns(gdn_layers=2, pages=3, ple=True)
    offsets, lanes = [11, 12, 13, 14, 15, 16], 4
    rows = [columns.column(7 + lane, 30 + lane, 5, 0.5 * lane, lane, offsets, list(range(20, 20 + held)), 9)
            for lane in range(lanes)]
    heads = [columns.head(7 + lane, 30 + lane, 5, 0.5 * lane, lane) for lane in range(lanes)]
    tails = [columns.tail(offsets, list(range(20, 20 + held)), 9)] * lanes
    packed = columns.pack(heads, tails)
    assert packed.shape == (columns.width, lanes) and packed.is_contiguous()
    assert torch.equal(packed, DecodeBatch.of(rows, columns, torch.device("cpu")).packed)
    with pytest.raises(ValueError, match="at most 3 pages"):
        columns.tail(offsets, [20, 21, 22, 23], 9)
    assert columns.pack([], []).shape == (columns.width, 0)
    # a graph's bucket: padding lanes after the live ones, as many as its lanes short of the bucket
    for bucket in (lanes, lanes + 1, 8):
        padded = [*rows, *[columns.padding(9)] * (bucket - lanes)]
        assert torch.equal(columns.pack(heads, tails, padded_to=bucket,
                                        padding=np.array(columns.padding(9), dtype=np.int64)),
                           DecodeBatch.of(padded, columns, torch.device("cpu")).packed)

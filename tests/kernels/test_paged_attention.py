"""Paged attention kernels against their torch references, and their batch and chunk invariance.

The caches are strided views into a fake pool whose pages hold K, V and spare bytes (so the page
stride is not page_rows x kv_heads x head_dim), with lanes' pages scattered and every slot no lane
wrote left random, so a stride or mask slip changes the result.
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs
import pytest
import torch

from tfd_kernels import paged_attention, sigmoid_gate
from tfd_kernels.paged_attention import decode, partials_for, reference_decode
from tfd_kernels.paged_prefill import prefill, reference_prefill

HEADS, HEAD_DIM, PAGE_ROWS = 4, 32, 8
SEGMENT = 128  # small, so lanes span several segments of two key blocks each
TOLERANCE = {torch.float32: {"rtol": 1e-4, "atol": 2e-5}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}


@attrs.frozen
class Paged:
    k: torch.Tensor
    v: torch.Tensor
    table: torch.Tensor
    scale: float


def paged(keys: list[int], *, kv_heads: int, dtype: torch.dtype, heads: int = HEADS, head_dim: int = HEAD_DIM,
          page_rows: int = PAGE_ROWS, max_pages: int = 40, device: str = "cpu", seed: int = 0) -> Paged:
    """Caches with room for each lane's ``keys`` on scattered pages; the last page is the zero null page."""
    g = torch.Generator(device=device).manual_seed(seed)
    needed = [-(-count // page_rows) for count in keys]
    pages = sum(needed) + 7  # some pages nobody holds
    row = page_rows * kv_heads * head_dim
    page = 2 * row + 128  # K, V and spare elements a page, 256-byte aligned parts as the pool packs them
    storage = torch.randn(pages + 1, page, generator=g, device=device).to(dtype)
    storage[pages] = 0
    k = storage[:, 64:64 + row].view(pages + 1, page_rows, kv_heads, head_dim)
    v = storage[:, 64 + row:64 + 2 * row].view(pages + 1, page_rows, kv_heads, head_dim)
    order = torch.randperm(pages, generator=g, device=device).to(torch.int32)
    table = torch.full((len(keys), max_pages), pages, dtype=torch.int32, device=device)
    taken = 0
    for lane, count in enumerate(needed):
        table[lane, :count] = order[taken:taken + count]
        taken += count
    return Paged(k, v, table, head_dim ** -0.5)


def queries(rows: int, dtype: torch.dtype, *, heads: int = HEADS, head_dim: int = HEAD_DIM,
            device: str = "cpu", seed: int = 1) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(rows, heads, head_dim, generator=g, device=device).to(dtype)


def run_decode(q: torch.Tensor, c: Paged, lengths: list[int], *, segment: int = SEGMENT,
               table: torch.Tensor | None = None, gate: torch.Tensor | None = None) -> torch.Tensor:
    table = c.table if table is None else table
    partials = partials_for(q.shape[0], q.shape[1], q.shape[2], table.shape[1] * c.k.shape[1], q.device,
                            segment=segment)
    length = torch.tensor(lengths, dtype=torch.int32, device=q.device)
    return decode(q, c.k, c.v, table, length, c.scale, torch.empty(q.shape, dtype=q.dtype, device=q.device),
                  partials, segment=segment, gate=gate)


def ref_decode(q: torch.Tensor, c: Paged, lengths: list[int]) -> torch.Tensor:
    length = torch.tensor(lengths, dtype=torch.int32, device=q.device)
    return reference_decode(q, c.k, c.v, c.table, length, c.scale, torch.empty_like(q))


def prefill_args(spans: list[tuple[int, int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``starts`` and ``cu_seqlens`` for lanes of (start, rows)."""
    bounds = [0]
    for _, rows in spans:
        bounds.append(bounds[-1] + rows)
    starts = torch.tensor([start for start, _ in spans], dtype=torch.int32, device=device)
    return starts, torch.tensor(bounds, dtype=torch.int32, device=device)


def run_prefill(q: torch.Tensor, c: Paged, spans: list[tuple[int, int]], *, reference: bool = False,
                table: torch.Tensor | None = None, **options: Any) -> torch.Tensor:
    """``options``: the kernel's ``span`` and ``split``."""
    starts, cu = prefill_args(spans, q.device)
    table = c.table if table is None else table
    if reference:
        return reference_prefill(q, c.k, c.v, table, starts, cu, c.scale, torch.zeros_like(q))
    return prefill(q, c.k, c.v, table, starts, cu, c.scale, torch.zeros_like(q),
                   max_rows=max(rows for _, rows in spans), **options)


def run_split(q: torch.Tensor, c: Paged, start: int, cuts: list[int], **options: Any) -> torch.Tensor:
    """Lane 0's rows from ``start`` prefilled in one call per piece between ``cuts`` (absolute)."""
    bounds = [start, *cuts, start + q.shape[0]]
    return torch.cat([run_prefill(q[a - start:b - start], c, [(a, b - a)], table=c.table[:1], **options)
                      for a, b in itertools.pairwise(bounds)])


LENGTHS = [300, 0, 1, 7, 129, 256]  # three segments, a padding lane, one key, one page, page/segment edges


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_decode_matches_reference(dtype: torch.dtype, kv_heads: int) -> None:
    c = paged(LENGTHS, kv_heads=kv_heads, dtype=dtype)
    q = queries(len(LENGTHS), dtype)
    got = run_decode(q, c, LENGTHS)
    torch.testing.assert_close(got, ref_decode(q, c, LENGTHS), **TOLERANCE[dtype])
    assert torch.equal(got[1], torch.zeros_like(got[1]))  # the padding lane


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_with_the_output_gate_is_the_gate_kernel_on_the_plain_output(dtype: torch.dtype) -> None:
    c = paged(LENGTHS, kv_heads=2, dtype=dtype)
    q_gate = queries(len(LENGTHS), dtype, head_dim=2 * HEAD_DIM, seed=5)  # per head [query | gate]
    q, gate = q_gate[..., :HEAD_DIM], q_gate[..., HEAD_DIM:]  # both read in place, as the model has them
    table, length = c.table, torch.tensor(LENGTHS, dtype=torch.int32)
    partials = partials_for(q.shape[0], q.shape[1], q.shape[2], table.shape[1] * c.k.shape[1], q.device)
    plain = decode(q, c.k, c.v, table, length, c.scale, torch.empty(q.shape, dtype=dtype), partials)
    want = sigmoid_gate.sigmoid_gate(plain.reshape(q.shape[0], -1), gate).view(q.shape)
    got = decode(q, c.k, c.v, table, length, c.scale, torch.empty(q.shape, dtype=dtype), partials, gate=gate)
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_reads_first_in_the_bits_of_the_plain_order(monkeypatch: pytest.MonkeyPatch,
                                                           dtype: torch.dtype) -> None:
    # LOADS_FIRST: the lengths, the first page entries and the gate read before the wait, the merge's first
    # block at once; short segments of 16 keys merged 2 at a time, so both loops of the merge run too
    monkeypatch.setattr(paged_attention, "SHORT_SEGMENT", 16)
    monkeypatch.setattr(paged_attention, "MERGE_BLOCK", 2)
    c = paged(LENGTHS, kv_heads=2, dtype=dtype)
    q_gate = queries(len(LENGTHS), dtype, head_dim=2 * HEAD_DIM, seed=5)
    check_reads_first(monkeypatch, c, q_gate[..., :HEAD_DIM], q_gate[..., HEAD_DIM:], LENGTHS, dtype)


def check_reads_first(monkeypatch: pytest.MonkeyPatch, c: Paged, q: torch.Tensor, gate: torch.Tensor,
                      lengths: list[int], dtype: torch.dtype) -> torch.Tensor:
    """Gated decode with LOADS_FIRST gives the plain order's bits, near the reference; its output."""
    got = {}
    for first in (False, True):
        monkeypatch.setattr(paged_attention, "LOADS_FIRST", first)
        got[first] = run_decode(q, c, lengths, gate=gate)
    assert torch.equal(got[True], got[False])
    plain = ref_decode(q, c, lengths)
    want = sigmoid_gate.sigmoid_gate(plain.reshape(q.shape[0], -1), gate).view(q.shape)
    torch.testing.assert_close(got[True], want, **TOLERANCE[dtype])
    return got[True]


def test_decode_one_default_segment_agrees_with_many(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paged_attention, "SHORT_KEYS", 0)  # no short segments: every lane in one
    c = paged(LENGTHS, kv_heads=2, dtype=torch.float32)
    q = queries(len(LENGTHS), torch.float32)
    torch.testing.assert_close(run_decode(q, c, LENGTHS, segment=512), run_decode(q, c, LENGTHS),
                               **TOLERANCE[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_short_segments_then_long_ones(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    # keys 0-255 in segments of 64, then of 128: lane 300 crosses over, 256 ends on the edge, 129 inside
    monkeypatch.setattr(paged_attention, "SHORT_KEYS", 256)
    monkeypatch.setattr(paged_attention, "SHORT_SEGMENT", 64)
    assert paged_attention.segments_for(300, SEGMENT) == 5 and paged_attention.segments_for(256, SEGMENT) == 4
    c = paged(LENGTHS, kv_heads=2, dtype=dtype)
    q = queries(len(LENGTHS), dtype)
    got = run_decode(q, c, LENGTHS)
    torch.testing.assert_close(got, ref_decode(q, c, LENGTHS), **TOLERANCE[dtype])
    for lane in (0, 4, 5):
        alone = run_decode(q[lane:lane + 1], c, [LENGTHS[lane]], table=c.table[lane:lane + 1])
        assert torch.equal(alone[0], got[lane])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_lane_is_bit_identical_alone_and_in_any_batch(dtype: torch.dtype) -> None:
    c = paged(LENGTHS, kv_heads=2, dtype=dtype)
    q = queries(len(LENGTHS), dtype)
    batch = run_decode(q, c, LENGTHS)
    flipped = list(reversed(range(len(LENGTHS))))
    shuffled = run_decode(q[flipped], attrs.evolve(c, table=c.table[flipped]), [LENGTHS[i] for i in flipped])
    assert torch.equal(shuffled, batch[flipped])
    for lane in (0, 4):
        pages = -(-LENGTHS[lane] // PAGE_ROWS)
        for table in (c.table[lane:lane + 1], c.table[lane:lane + 1, :pages]):  # a narrower table too
            alone = run_decode(q[lane:lane + 1], c, [LENGTHS[lane]], table=table.contiguous())
            assert torch.equal(alone[0], batch[lane])


SPANS = [(0, 37), (19, 45), (70, 1), (5, 0), (64, 20)]  # fresh, cached prefix, one row, no rows, aligned


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_prefill_matches_reference(dtype: torch.dtype, kv_heads: int) -> None:
    c = paged([start + rows for start, rows in SPANS], kv_heads=kv_heads, dtype=dtype, max_pages=16)
    q = queries(sum(rows for _, rows in SPANS), dtype)
    torch.testing.assert_close(run_prefill(q, c, SPANS), run_prefill(q, c, SPANS, reference=True),
                               **TOLERANCE[dtype])


def test_prefill_of_a_group_not_a_power_of_two_matches_reference() -> None:
    # three query heads a kv head, padded to four in the tile (Flash Next's QSA rows: twelve, to sixteen)
    c = paged([start + rows for start, rows in SPANS], kv_heads=2, dtype=torch.float32, heads=6, max_pages=16)
    q = queries(sum(rows for _, rows in SPANS), torch.float32, heads=6)
    torch.testing.assert_close(run_prefill(q, c, SPANS), run_prefill(q, c, SPANS, reference=True),
                               **TOLERANCE[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_rows_are_bit_identical_split_at_64_and_in_any_batch(dtype: torch.dtype) -> None:
    start, rows = 3, 150
    c = paged([start + rows, 90], kv_heads=2, dtype=dtype, max_pages=24)
    q = queries(rows + 40, dtype)
    mine, other = q[:rows], q[rows:]
    whole = run_prefill(mine, c, [(start, rows)], table=c.table[:1])
    assert torch.equal(run_split(mine, c, start, [64, 128]), whole)
    flipped = attrs.evolve(c, table=c.table.flip(0))
    both = run_prefill(torch.cat([other, mine]), flipped, [(50, 40), (start, rows)])
    assert torch.equal(both[40:], whole)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_prefill_spans_run_apart_or_walked_give_the_same_bits(dtype: torch.dtype, kv_heads: int) -> None:
    # keys in spans of 128: lanes of one, two and three spans; a chunk whose tile starts at a span's start
    spans = [(3, 150), (50, 40), (0, 1), (128, 33), (250, 6)]
    c = paged([start + rows for start, rows in spans], kv_heads=kv_heads, dtype=dtype, max_pages=40)
    q = queries(sum(rows for _, rows in spans), dtype)
    walked = run_prefill(q, c, spans, span=128, split=False)
    assert torch.equal(run_prefill(q, c, spans, span=128, split=True), walked)
    torch.testing.assert_close(walked, run_prefill(q, c, spans, reference=True), **TOLERANCE[dtype])
    mine = q[:150]  # a resumed turn's short chunks, their spans apart, against the whole prompt walked
    assert torch.equal(run_split(mine, c, 3, [64, 128, 140], span=128, split=True), walked[:150])


def test_prefill_span_must_hold_whole_tiles() -> None:
    c = paged([20], kv_heads=2, dtype=torch.float32)
    with pytest.raises(ValueError, match="span must be a positive multiple of 128, got 96"):
        run_prefill(queries(4, torch.float32), c, [(0, 4)], span=96)


def test_prefill_last_row_agrees_with_decode() -> None:
    c = paged([160], kv_heads=2, dtype=torch.float32, max_pages=24)
    q = queries(33, torch.float32)
    rows = run_prefill(q, c, [(127, 33)])
    torch.testing.assert_close(rows[-1:], run_decode(q[-1:], c, [160]), **TOLERANCE[torch.float32])


def test_wrong_arguments_are_named() -> None:
    c = paged([20], kv_heads=2, dtype=torch.float32)
    q = queries(1, torch.float32)
    length = torch.tensor([20], dtype=torch.int32)
    partials = partials_for(1, HEADS, HEAD_DIM, 40 * PAGE_ROWS, "cpu")
    out = torch.empty_like(q)
    with pytest.raises(ValueError, match="page_table"):
        decode(q, c.k, c.v, c.table.long(), length, c.scale, out, partials)
    with pytest.raises(ValueError, match="lengths"):
        decode(q, c.k, c.v, c.table, length.long(), c.scale, out, partials)
    with pytest.raises(ValueError, match="partials"):
        decode(q, c.k, c.v, c.table, length, c.scale, out, partials[:, :0])
    with pytest.raises(ValueError, match="k_cache"):
        decode(queries(1, torch.float32, heads=3), c.k, c.v, c.table, length, c.scale, out, partials)
    with pytest.raises(ValueError, match="v_cache"):
        decode(q, c.k, c.v.to(torch.bfloat16), c.table, length, c.scale, out, partials)
    with pytest.raises(ValueError, match="out"):
        decode(q, c.k, c.v, c.table, length, c.scale, out.to(torch.bfloat16), partials)
    starts, cu = prefill_args([(0, 1)], q.device)
    with pytest.raises(ValueError, match="cu_seqlens"):
        prefill(q, c.k, c.v, c.table, starts, cu[:1], c.scale, out)


@pytest.mark.gpu
@pytest.mark.parametrize(("heads", "kv_heads", "page_rows"), [(16, 2, 64), (32, 4, 16)])
def test_decode_real_sizes_on_gpu(heads: int, kv_heads: int, page_rows: int) -> None:
    lengths = [70_000, 0, 1, 4_097, 513]
    c = paged(lengths, kv_heads=kv_heads, dtype=torch.bfloat16, heads=heads, head_dim=256,
              page_rows=page_rows, max_pages=262_144 // page_rows, device="cuda")
    q = queries(len(lengths), torch.bfloat16, heads=heads, head_dim=256, device="cuda")
    batch = run_decode(q, c, lengths, segment=512)
    torch.testing.assert_close(batch, ref_decode(q, c, lengths), **TOLERANCE[torch.bfloat16])
    gate = torch.randn_like(q)
    partials = partials_for(q.shape[0], q.shape[1], q.shape[2], c.table.shape[1] * c.k.shape[1], q.device,
                            segment=512)
    gated = decode(q, c.k, c.v, c.table, torch.tensor(lengths, dtype=torch.int32, device=q.device), c.scale,
                   torch.empty_like(q), partials, segment=512, gate=gate)
    assert torch.equal(gated, sigmoid_gate.sigmoid_gate(batch.reshape(q.shape[0], -1), gate).view(q.shape))
    for lane in (0, 3):
        alone = run_decode(q[lane:lane + 1], c, [lengths[lane]], segment=512, table=c.table[lane:lane + 1])
        assert torch.equal(alone[0], batch[lane])


@pytest.mark.gpu
# the 35B-A3B's, the 9B's doubled, Flash Next's (QSA's rows before its budget: a group of 12)
@pytest.mark.parametrize(("heads", "kv_heads", "page_rows"), [(16, 2, 64), (32, 4, 16), (24, 2, 64)])
def test_prefill_real_sizes_on_gpu(heads: int, kv_heads: int, page_rows: int) -> None:
    start, rows = 1_000, 700
    c = paged([start + rows, 300], kv_heads=kv_heads, dtype=torch.bfloat16, heads=heads, head_dim=256,
              page_rows=page_rows, max_pages=4096 // page_rows, device="cuda")
    q = queries(rows + 300, torch.bfloat16, heads=heads, head_dim=256, device="cuda")
    spans = [(start, rows), (0, 300)]
    both = run_prefill(q, c, spans)
    torch.testing.assert_close(both, run_prefill(q, c, spans, reference=True), **TOLERANCE[torch.bfloat16])
    assert torch.equal(run_split(q[:rows], c, start, [1_024, 1_472]), both[:rows])


@pytest.mark.gpu
@pytest.mark.parametrize(("heads", "kv_heads", "page_rows"), [(16, 4, 64), (32, 2, 16)])
def test_prefill_short_chunk_over_a_long_prefix_on_gpu(heads: int, kv_heads: int, page_rows: int) -> None:
    # a resumed turn: 64 rows after 20,000 keys run their ten spans apart; the same bits as the prompt
    # walked whole, near the reference
    length = 20_064
    c = paged([length], kv_heads=kv_heads, dtype=torch.bfloat16, heads=heads, head_dim=256,
              page_rows=page_rows, max_pages=32_768 // page_rows, device="cuda")
    q = queries(length, torch.bfloat16, heads=heads, head_dim=256, device="cuda")
    walked = run_prefill(q, c, [(0, length)], split=False)
    tail = run_prefill(q[-64:], c, [(length - 64, 64)])
    assert torch.equal(tail, walked[-64:])
    assert torch.equal(run_split(q[-64:], c, length - 64, [length - 40]), walked[-64:])
    torch.testing.assert_close(tail, run_prefill(q[-64:], c, [(length - 64, 64)], reference=True),
                               **TOLERANCE[torch.bfloat16])


@pytest.mark.gpu
def test_decode_reads_first_on_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    # LOADS_FIRST (lengths, page entries and the gate before the launch's wait): the bits of the plain order,
    # a lane's row alone and in the batch the same, near the reference, at the model's sizes
    lengths = [1_100, 0, 1, 4_097, 513]
    c = paged(lengths, kv_heads=2, dtype=torch.bfloat16, heads=16, head_dim=256, page_rows=64, max_pages=70,
              device="cuda")
    q_gate = queries(len(lengths), torch.bfloat16, heads=16, head_dim=512, device="cuda")
    q, gate = q_gate[..., :256], q_gate[..., 256:]
    batch = check_reads_first(monkeypatch, c, q, gate, lengths, torch.bfloat16)
    for lane in (0, 3):
        alone = run_decode(q[lane:lane + 1], c, [lengths[lane]], table=c.table[lane:lane + 1],
                           gate=gate[lane:lane + 1])
        assert torch.equal(alone[0], batch[lane])

"""A forward's prompt spans as the prompt kernels address them (``PromptLanes.of``): each lane's rows,
positions, K/V places and GDN offsets, every per-row and per-lane field 16-byte aligned whatever the
counts (Triton compiles a kernel again for a pointer that is not, so a count's parity would compile a
variant while serving)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tfd.model.memory import ALIGN, LaneMemory, LanesOnce, PromptLanes, Span, packed_on

PAGE_ROWS = 4
PIECE = 64  # bytes of each lane's GDN state and conv tail


def lanes_for(lengths: tuple[int, ...], starts: tuple[int, ...], host: bool = False
              ) -> tuple[list[Span], torch.Tensor]:
    """Lanes of ``lengths`` rows from ``starts``, each on its own pages (``host``: with the tables' host
    copies, as a pool lease's lanes have them, each holding a null entry past its rows)."""
    buffer = torch.zeros(2 * PIECE * len(lengths) + 256, dtype=torch.uint8)
    spans = []
    for lane, (start, n) in enumerate(zip(starts, lengths, strict=True)):
        at = 2 * PIECE * lane
        pieces = {"g.state": buffer[at:at + PIECE].view(torch.float32),
                  "g.conv_tail": buffer[at + PIECE:at + 2 * PIECE].view(torch.float32)}
        pages = torch.arange(3 * lane, 3 * lane + (start + n + PAGE_ROWS - 1) // PAGE_ROWS, dtype=torch.int32)
        memory = LaneMemory(pieces, pages, np.append(pages.numpy(), 99).astype(np.int32)) if host else \
            LaneMemory(pieces, pages)
        spans.append(Span(memory, start, torch.zeros(n, dtype=torch.long)))
    return spans, buffer


@pytest.mark.parametrize(("lengths", "starts"), [
    ((5,), (0,)),  # one lane (two lane columns with cu_seqlens' end), odd rows
    ((6,), (3,)),  # even rows
    ((3, 4), (0, 9)),  # two lanes (three lane columns), odd rows
    ((3, 5), (2, 0)),  # even rows
    ((1, 2, 4), (7, 0, 1))])  # three lanes (four lane columns), odd rows
@pytest.mark.parametrize("host", [False, True])
def test_fields_are_the_spans_and_each_starts_16_byte_aligned(lengths: tuple[int, ...],
                                                              starts: tuple[int, ...], host: bool) -> None:
    spans, buffer = lanes_for(lengths, starts, host)
    found = PromptLanes.of(spans, ["g"], buffer, PAGE_ROWS, 99, torch.float32)
    positions = [p for start, n in zip(starts, lengths, strict=True) for p in range(start, start + n)]
    owners = [lane for lane, n in enumerate(lengths) for _ in range(n)]
    assert found.positions.tolist() == positions
    assert found.slots.tolist() == [p % PAGE_ROWS for p in positions]
    assert found.pages.tolist() == [3 * lane + p // PAGE_ROWS
                                    for lane, p in zip(owners, positions, strict=True)]
    assert found.cu_seqlens.tolist() == [sum(lengths[:i]) for i in range(len(lengths) + 1)]
    assert found.starts.tolist() == list(starts) and found.max_rows == max(lengths)
    # every lane's table, padded with the null page to the widest (a host copy's null entry past its rows)
    tables = [span.lane.page_table.tolist() + [99] * host for span in spans]
    width = max(map(len, tables))
    assert found.page_table.tolist() == [t + [99] * (width - len(t)) for t in tables]
    state_at, tail_at = found.offsets_of("g")
    assert state_at.tolist() == [2 * PIECE * lane // 4 for lane in range(len(lengths))]  # fp32 elements
    assert tail_at.tolist() == [(2 * PIECE * lane + PIECE) // 4 for lane in range(len(lengths))]
    for field in (found.positions, found.slots, found.pages, found.cu_seqlens, found.starts, found.page_table,
                  state_at, tail_at):
        assert field.data_ptr() % 16 == 0 and field.is_contiguous()
    with pytest.raises(KeyError):
        found.offsets_of("h")


@pytest.mark.parametrize("count", [1, 2, 3, 4])  # 4, 8, 12 and 16 bytes of int32 before the next part
def test_packed_parts_keep_their_values_and_each_starts_aligned(count: int) -> None:
    parts = {"ints": np.arange(count, dtype=np.int32), "longs": np.arange(6, dtype=np.int64).reshape(2, 3),
             "table": np.full((count, 3), 7, dtype=np.int32)}
    held = packed_on(parts, torch.device("cpu"))
    for name, part in parts.items():
        assert held[name].numpy().tolist() == part.tolist() and held[name].shape == part.shape
        assert held[name].data_ptr() % ALIGN == 0


def test_lanes_made_once_when_first_asked_for_are_the_lanes() -> None:
    spans, buffer = lanes_for((3, 4), (0, 9), host=True)
    once = LanesOnce(spans, ["g"], buffer, PAGE_ROWS, 99, torch.float32)
    made = once.get()
    assert once.get() is made and made.get() is made
    want = PromptLanes.of(spans, ["g"], buffer, PAGE_ROWS, 99, torch.float32)
    for field in ("cu_seqlens", "starts", "page_table", "pages", "slots", "positions", "offsets"):
        assert torch.equal(getattr(made, field), getattr(want, field)), field

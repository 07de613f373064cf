"""A forward's prompt spans as the prompt kernels address them (``PromptLanes.of``): each lane's rows,
positions, K/V places and GDN offsets, every per-row and per-lane field 16-byte aligned whatever the
counts (Triton compiles a kernel again for a pointer that is not, so a count's parity would compile a
variant while serving)."""

from __future__ import annotations

import pytest
import torch

from tfd.model.memory import LaneMemory, PromptLanes, Span, even_columns

PAGE_ROWS = 4
PIECE = 64  # bytes of each lane's GDN state and conv tail


def lanes_for(lengths: tuple[int, ...], starts: tuple[int, ...]) -> tuple[list[Span], torch.Tensor]:
    buffer = torch.zeros(2 * PIECE * len(lengths) + 256, dtype=torch.uint8)
    spans = []
    for lane, (start, n) in enumerate(zip(starts, lengths, strict=True)):
        at = 2 * PIECE * lane
        pieces = {"g.state": buffer[at:at + PIECE].view(torch.float32),
                  "g.conv_tail": buffer[at + PIECE:at + 2 * PIECE].view(torch.float32)}
        pages = torch.arange(3 * lane, 3 * lane + (start + n + PAGE_ROWS - 1) // PAGE_ROWS, dtype=torch.int32)
        spans.append(Span(LaneMemory(pieces, pages), start, torch.zeros(n, dtype=torch.long)))
    return spans, buffer


@pytest.mark.parametrize(("lengths", "starts"), [
    ((5,), (0,)),  # one lane (two lane columns with cu_seqlens' end), odd rows
    ((6,), (3,)),  # even rows
    ((3, 4), (0, 9)),  # two lanes (three lane columns), odd rows
    ((3, 5), (2, 0)),  # even rows
    ((1, 2, 4), (7, 0, 1))])  # three lanes (four lane columns), odd rows
def test_fields_are_the_spans_and_each_starts_16_byte_aligned(lengths: tuple[int, ...],
                                                              starts: tuple[int, ...]) -> None:
    spans, buffer = lanes_for(lengths, starts)
    found = PromptLanes.of(spans, ["g"], buffer, PAGE_ROWS, 99, torch.float32)
    positions = [p for start, n in zip(starts, lengths, strict=True) for p in range(start, start + n)]
    owners = [lane for lane, n in enumerate(lengths) for _ in range(n)]
    assert found.positions.tolist() == positions
    assert found.slots.tolist() == [p % PAGE_ROWS for p in positions]
    assert found.pages.tolist() == [3 * lane + p // PAGE_ROWS
                                    for lane, p in zip(owners, positions, strict=True)]
    assert found.cu_seqlens.tolist() == [sum(lengths[:i]) for i in range(len(lengths) + 1)]
    assert found.starts.tolist() == list(starts) and found.max_rows == max(lengths)
    state_at, tail_at = found.offsets["g"]
    assert state_at.tolist() == [2 * PIECE * lane // 4 for lane in range(len(lengths))]  # fp32 elements
    assert tail_at.tolist() == [(2 * PIECE * lane + PIECE) // 4 for lane in range(len(lengths))]
    for field in (found.positions, found.slots, state_at, tail_at):
        assert field.data_ptr() % 16 == 0 and field.is_contiguous()


def test_even_columns_pads_an_odd_count_alone() -> None:
    odd, even = torch.ones(3, 5, dtype=torch.int64), torch.ones(3, 4, dtype=torch.int64)
    assert even_columns(odd).shape == (3, 6) and even_columns(odd)[:, 5].eq(0).all()
    assert torch.equal(even_columns(even), even)

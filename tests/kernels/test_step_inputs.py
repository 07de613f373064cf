"""A decode step's inputs gathered in one launch: the bits torch's indexing and casts give, and angle
tables whose rows are the angles computed at each position."""

from __future__ import annotations

import pytest
import torch

from tfd.model.rope import Rotary
from tfd_kernels import step_inputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def packed_batch(lanes: int, pages: int, vocab: int, rows: int, device: str) -> tuple[torch.Tensor, int]:
    """[fields, lanes] int64 like DecodeBatch.packed, a wider buffer's slice (as a graph's inputs are):
    tokens, positions, visible keys, two offset fields, then the page table."""
    gen = torch.Generator().manual_seed(lanes * 7 + pages)
    fields = 5 + pages
    buffer = torch.randint(0, 1 << 40, (fields, lanes + 3), generator=gen)
    buffer[0] = torch.randint(0, vocab, (lanes + 3,), generator=gen)
    buffer[1] = torch.randint(0, rows, (lanes + 3,), generator=gen)
    buffer[2] = buffer[1] + 1
    buffer[5:] = torch.randint(0, 5000, (pages, lanes + 3), generator=gen)
    buffer[:, -1] = torch.tensor([0, 0, 0, -1, -1, *[7] * pages])  # a padding lane
    return buffer.to(device)[:, 3:], 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("lanes", "hidden", "pages"), [(1, 40, 3), (3, 1100, 1030), (2, 64, 0)])
def test_gathered_inputs_are_the_bits_torch_gives(dtype: torch.dtype, lanes: int, hidden: int,
                                                  pages: int) -> None:
    packed, field = packed_batch(lanes, pages, vocab=50, rows=90, device=DEVICE)
    embed = torch.randn(50, hidden, dtype=dtype, device=DEVICE)
    cos, sin = torch.randn(2, 90, 12, dtype=dtype, device=DEVICE).unbind(0)
    got = step_inputs.gather(packed, field, embed, cos.contiguous(), sin.contiguous())
    want = step_inputs.reference(packed, field, embed, cos.contiguous(), sin.contiguous())
    for name in ("x", "cos", "sin", "table", "lengths"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert got.table.is_contiguous() and got.table.dtype == torch.int32 and got.lengths.dtype == torch.int32
    assert torch.equal(want.x, embed[packed[0]]) and torch.equal(want.lengths.long(), packed[2])


def test_a_fed_token_is_the_last_draw_at_its_row_and_is_written_back() -> None:
    # a step launched before the host saw the last one's tokens names their rows: -(row + 1)
    packed, field = packed_batch(3, 2, vocab=50, rows=90, device=DEVICE)
    embed = torch.randn(50, 1100, device=DEVICE)  # two embedding tiles resolve the token alike
    cos, sin = torch.randn(2, 90, 12, device=DEVICE).unbind(0)
    feed = torch.tensor([41, 7, 19, 3], device=DEVICE)
    tokens = torch.tensor([-3, 12, -1], device=DEVICE)
    packed[0] = tokens
    other = packed.clone()
    got = step_inputs.gather(packed, field, embed, cos.contiguous(), sin.contiguous(), feed)
    want = step_inputs.reference(other, field, embed, cos.contiguous(), sin.contiguous(), feed)
    assert packed[0].tolist() == [19, 12, 41] and torch.equal(other, packed)
    assert torch.equal(got.x, embed[torch.tensor([19, 12, 41], device=DEVICE)]) and torch.equal(got.x, want.x)
    with pytest.raises(ValueError, match="feed must be"):
        step_inputs.gather(packed, field, embed, cos.contiguous(), sin.contiguous(), feed.int())


def test_inputs_that_do_not_fit_are_refused() -> None:
    packed, field = packed_batch(2, 3, vocab=10, rows=20, device="cpu")
    embed, table = torch.randn(10, 8), torch.randn(20, 4)
    with pytest.raises(ValueError, match="packed must be int64"):
        step_inputs.gather(packed.int(), field, embed, table, table)
    with pytest.raises(ValueError, match="packed must be int64"):
        step_inputs.gather(packed, packed.shape[0] + 1, embed, table, table)
    with pytest.raises(ValueError, match="embed must be"):
        step_inputs.gather(packed, field, embed.T, table, table)
    with pytest.raises(ValueError, match="angle tables"):
        step_inputs.gather(packed, field, embed, table, torch.randn(20, 6))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_table_rows_are_the_angles_at_each_position_on_the_device(dtype: torch.dtype) -> None:
    rotary = Rotary.of(256, 0.25, 10_000_000.0, "cuda")
    cos_table, sin_table = rotary.angles(torch.arange(300_000, device="cuda"), dtype)
    positions = torch.tensor([0, 1, 5, 1023, 1024, 4097, 65_535, 262_143, 299_999], device="cuda")
    for at in (positions, positions[3:4], positions.flip(0)):
        cos, sin = rotary.angles(at, dtype)
        assert torch.equal(cos_table[at], cos) and torch.equal(sin_table[at], sin)

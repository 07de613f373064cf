"""The word-sum kernel: each payload's S exactly as torch's int64 form gives it, the largest words
included, keyed from any first word, across its programs' blocks; bad shapes refused by name."""

from __future__ import annotations

import pytest
import torch

from tfd.store.checksum import word_sum
from tfd_kernels import word_sums


def words(rows: int, count: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-2**31, 2**31, (rows, count), dtype=torch.int64, generator=generator).to(torch.int32)


@pytest.mark.parametrize(("rows", "count", "first"), [(3, 1000, 0), (1, 128, 0), (2, 129, 7), (4, 0, 0),
                                                      (1, 300, 2**31 - 300)])
def test_each_row_sums_as_torch_does(rows: int, count: int, first: int) -> None:
    data = words(rows, count, rows + count)
    high, low = word_sums.halves(data, first, block=128)  # several programs a row, the last one short
    want_high, want_low = word_sums.reference(data, first)
    assert high.tolist() == want_high.tolist() and low.tolist() == want_low.tolist()


def test_the_largest_words_sum_without_wrapping() -> None:
    data = torch.full((2, 700), -1, dtype=torch.int32)  # every word 2**32 - 1
    high, low = word_sums.halves(data, block=128)
    total = (int(high[0]) << 32) + int(low[0])
    assert total == word_sum(data[0].view(torch.uint8)) > 2**63
    assert high.tolist() == [high[0].item()] * 2


def test_rows_with_a_stride_are_summed_in_place() -> None:
    data = words(3, 256, 9)
    high, low = word_sums.halves(data[:, :200], block=64)  # rows of 200 words, 256 apart
    want_high, want_low = word_sums.reference(data[:, :200].contiguous())
    assert high.tolist() == want_high.tolist() and low.tolist() == want_low.tolist()


def test_what_cannot_be_summed_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="words must be"):
        word_sums.halves(torch.zeros(8, dtype=torch.int32))
    with pytest.raises(ValueError, match="words must be"):
        word_sums.halves(torch.zeros(2, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match="cannot be keyed"):
        word_sums.halves(torch.zeros(1, 8, dtype=torch.int32), 2**31 - 4)


@pytest.mark.gpu
def test_the_device_sums_a_states_blocks_as_torch_does() -> None:
    data = words(118, 2 << 20, 11).cuda()  # a 30,000-token state's 8 MiB blocks of the 9B shape
    high, low = word_sums.halves(data)
    want_high, want_low = word_sums.reference(data)
    assert torch.equal(high, want_high) and torch.equal(low, want_low)
    high, low = word_sums.halves(data[:1, 7:], 7)  # keyed from a later word, at an odd address
    want_high, want_low = word_sums.reference(data[:1, 7:].contiguous(), 7)
    assert torch.equal(high, want_high) and torch.equal(low, want_low)

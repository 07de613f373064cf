"""The word sum: exact against its definition at the extremes, the same in pieces and per file,
and moved by any change of one word and any swap of two."""

from __future__ import annotations

import random

import pytest
import torch

from tfd.store import checksum
from tfd.store.checksum import WordSum, file_sums, word_sum
from tfd_kernels import word_sums


def defined(data: bytes, first_word: int = 0) -> int:
    """S as its definition says, in Python integers."""
    padded = data + b"\0" * (-len(data) % 4)
    total = 0
    for i in range(len(padded) // 4):
        word = int.from_bytes(padded[4 * i:4 * i + 4], "little")
        total += word * ((((first_word + i + 1) * 2654435761) % 2**31) | 1)
    return total


def tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


@pytest.mark.parametrize("size", [0, 1, 3, 4, 7, 64, 1001])
def test_the_sum_is_its_definition(size: int) -> None:
    data = random.Random(size).randbytes(size)
    assert word_sum(tensor(data)) == defined(data)
    assert word_sum(tensor(data), 1000) == defined(data, 1000)


def test_the_largest_words_do_not_wrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checksum, "GROUP_BYTES", 64)  # many groups, each summed exactly
    data = b"\xff" * 4096
    assert word_sum(tensor(data)) == defined(data) > 2**63
    assert file_sums(tensor(data), [2048, 2048]) == [defined(data[:2048])] * 2


def test_pieces_of_any_length_sum_as_the_whole() -> None:
    rng = random.Random(1)
    data = rng.randbytes(5000)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(data)), 6))
        running = WordSum()
        for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True):
            running.update(memoryview(data)[a:b])
        assert running.total() == defined(data)


def test_each_file_sums_alone_whatever_its_size_or_place() -> None:
    rng = random.Random(2)
    sizes = [256, 256, 256, 100, 6, 256, 256, 37]  # runs of equal blocks, odd sizes, misaligned ones
    data = rng.randbytes(sum(sizes))
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    want = [defined(data[a:a + n]) for a, n in zip(starts, sizes, strict=True)]
    assert file_sums(tensor(data), sizes) == want
    with pytest.raises(ValueError, match="payloads of 1 bytes in all, the data holds 0"):
        file_sums(tensor(b""), [1])


def test_any_change_of_one_word_and_any_swap_of_two_moves_the_sum() -> None:
    rng = random.Random(3)
    data = bytearray(rng.randbytes(4096))
    whole = word_sum(tensor(bytes(data)))
    for _ in range(200):
        changed = bytearray(data)
        at = rng.randrange(len(data) // 4) * 4
        word = int.from_bytes(data[at:at + 4], "little") ^ rng.randrange(1, 2**32)
        changed[at:at + 4] = word.to_bytes(4, "little")
        assert word_sum(tensor(bytes(changed))) != whole
        i, j = rng.sample(range(len(data) // 4), 2)
        swapped = bytearray(data)
        swapped[4 * i:4 * i + 4], swapped[4 * j:4 * j + 4] = data[4 * j:4 * j + 4], data[4 * i:4 * i + 4]
        assert word_sum(tensor(bytes(swapped))) != whole or data[4 * i:4 * i + 4] == data[4 * j:4 * j + 4]


def test_a_payload_too_long_to_key_is_refused() -> None:
    with pytest.raises(ValueError, match="more than 2147483648 words"):
        word_sums.keys(2**31 - 1, 2, torch.device("cpu"))


@pytest.mark.gpu
def test_the_device_sums_as_the_host() -> None:
    sizes = [8 << 20] * 9 + [3 << 20, 48 << 20 | 6]  # a state's blocks, a short last one, its pieces
    data = torch.randint(0, 256, (sum(sizes),), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    assert file_sums(data.cuda(), sizes) == file_sums(data, sizes)


def test_a_file_longer_than_a_group_sums_in_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checksum, "GROUP_BYTES", 64)
    data = random.Random(6).randbytes(1000)
    assert file_sums(tensor(data + data[:10]), [1000, 0, 10]) == [defined(data), 0, defined(data[:10])]


def test_the_kernel_sums_every_file_as_torch_does(monkeypatch: pytest.MonkeyPatch) -> None:
    # the GPU's path (tfd_kernels.word_sums, here in Triton's interpreter): runs of equal files in one
    # launch, odd and misaligned ones alone, a window keyed from a later word
    sizes = [256, 256, 256, 100, 6, 256, 256, 37]
    data = random.Random(7).randbytes(sum(sizes))
    want = file_sums(tensor(data), sizes)
    window = word_sum(tensor(data)[512:1024], 128)
    monkeypatch.setattr(checksum, "on_kernel", lambda _: True)
    assert file_sums(tensor(data), sizes) == want
    assert word_sum(tensor(data)[512:1024], 128) == window == defined(data[512:1024], 128)

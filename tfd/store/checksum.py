"""The word sum: a sealed payload's check, computed by whichever device holds the bytes.

A payload of n bytes, zero-padded to whole 32-bit little-endian words ``w_0 .. w_(m-1)`` (read
unsigned), sums to ``S = sum_i w_i * key(i)`` with ``key(i) = ((i + 1) * 2654435761 mod 2**31) | 1``,
an exact integer (each product is below 2**63 and the sums are split in 32-bit halves, so torch's
int64 never wraps; S is below 2**95 for payloads under 8 GiB), kept in 16 bytes. Any change of one
word moves S (a key is odd, a product nonzero), as does any swap of two different words at two
different keys; other changes are missed with odds near 2**-31. Sums are additive: a payload's S is
the sum of its pieces' S, each keyed from its first word.

Why not a CRC on the host: a learned state is read back while its request waits for the first
token. On the H200's host, 16 threads read a 30,000-token state's files from the page cache at
about 39 GB/s, but checked with CRC-32 as they went only at 13.8 (the check is one more pass over a
gigabyte of host memory); the device sums the same gigabyte, already copied: torch's int64 form
took 7 to 8.7 ms, a GPU sums with ``tfd_kernels.word_sums`` instead (one read of the bytes, one launch
a run of equal files). Writes are summed on the device too, window by window as the copier
gathers them (``tfd.store.copies``): summed on the host, torch took every core and slowed the
prefill steps running beside the writer.
Files written on the host (tests, tools) are summed there (``WordSum``), to the same value.
"""

from __future__ import annotations

import torch

from tfd_kernels import word_sums
from tfd_kernels.word_sums import KEY_MASK, MULTIPLIER

SUM_BYTES = 16
GROUP_BYTES = 64 << 20  # summed at a time off a GPU: bounds the int64 temporaries (four times this)


def on_kernel(data: torch.Tensor) -> bool:
    """Whether ``data`` is summed by ``tfd_kernels.word_sums`` (on a GPU) rather than by torch's int64
    form."""
    return data.is_cuda


def halves(data: torch.Tensor, first_word: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """S of the bytes ``data`` (uint8, 1-D, any length and device) keyed from word ``first_word``,
    as [1] (high, low) halves on its device, without waiting for it: ``GROUP_BYTES`` at a time."""
    words = _padded(data).view(torch.int32)
    if on_kernel(data):  # one launch, no int64 temporaries
        return word_sums.halves(words[None], first_word)
    step = GROUP_BYTES // 4
    pieces = [words[at:at + step] for at in range(0, max(words.numel(), 1), step)]
    found = [word_sums.reference(piece[None], first_word + at * step) for at, piece in enumerate(pieces)]
    if len(found) == 1:
        return found[0]
    return torch.stack([h for h, _ in found]).sum(0), torch.stack([lo for _, lo in found]).sum(0)


def _padded(data: torch.Tensor) -> torch.Tensor:
    """Bytes zero-padded to whole words, at a word-aligned address (viewable as int32)."""
    extra = -data.numel() % 4
    if extra:
        return torch.cat([data, data.new_zeros(extra)])
    return data if data.storage_offset() % 4 == 0 else data.clone()


def joined(high: torch.Tensor, low: torch.Tensor) -> int:
    """S from its [1] halves (waits for the device)."""
    return (int(high.item()) << 32) + int(low.item())


def word_sum(data: torch.Tensor, first_word: int = 0) -> int:
    """S of the bytes ``data`` (uint8, 1-D, any device), keyed from word ``first_word`` (waits for
    the device)."""
    return joined(*halves(data, first_word))


def file_sums(data: torch.Tensor, sizes: list[int]) -> list[int]:
    """S of each of the consecutive payloads of ``sizes`` bytes that ``data`` (uint8, 1-D, any
    device) holds in order; the equal-sized ones summed together, one wait for the device in all."""
    if sum(sizes) != data.numel():
        raise ValueError(f"payloads of {sum(sizes)} bytes in all, the data holds {data.numel()}")
    parts: list[tuple[torch.Tensor, torch.Tensor]] = []
    at, index = 0, 0
    while index < len(sizes):
        size, run = sizes[index], 1
        aligned = size % 4 == 0 and (data.storage_offset() + at) % 4 == 0
        while aligned and index + run < len(sizes) and sizes[index + run] == size:
            run += 1
        if not aligned or (run == 1 and not on_kernel(data)):
            parts.append(halves(data[at:at + size]))
        else:
            rows = data[at:at + size * run].view(run, size).view(torch.int32)
            if on_kernel(data):  # one launch a run
                parts.append(word_sums.halves(rows))
            else:
                group = max(1, GROUP_BYTES // size)
                parts += [word_sums.reference(rows[first:first + group]) for first in range(0, run, group)]
        at, index = at + size * run, index + run
    highs = torch.cat([h for h, _ in parts]).tolist() if parts else []
    lows = torch.cat([lo for _, lo in parts]).tolist() if parts else []
    return [(h << 32) + lo for h, lo in zip(highs, lows, strict=True)]


def mismatched(data: torch.Tensor, sizes: list[int], expected: list[int]) -> list[int]:
    """The places of the payloads in ``data`` (as ``file_sums`` takes them) whose S is not the one
    ``expected``."""
    found = file_sums(data, sizes)
    return [place for place, (a, b) in enumerate(zip(found, expected, strict=True)) if a != b]


class WordSum:
    """S of bytes given in pieces of any length, on the host."""

    def __init__(self) -> None:
        self.value = 0
        self.words = 0  # whole words summed so far
        self.carry = b""  # the bytes of a word not yet whole

    def update(self, data: bytes | memoryview) -> None:
        data = memoryview(data).cast("B")
        if self.carry:
            need = 4 - len(self.carry)
            self.carry += bytes(data[:need])
            data = data[need:]
            if len(self.carry) < 4:
                return
            self._add(memoryview(self.carry))
            self.carry = b""
        whole = len(data) - len(data) % 4
        if whole:
            self._add(data[:whole])
        self.carry = bytes(data[whole:])

    def total(self) -> int:
        """S of everything given (a last partial word zero-padded)."""
        if not self.carry:
            return self.value
        last = int.from_bytes(self.carry.ljust(4, b"\0"), "little")
        return self.value + last * _key(self.words)

    def _add(self, data: memoryview) -> None:
        host = torch.frombuffer(data if not data.readonly else bytearray(data), dtype=torch.uint8)
        self.value += word_sum(host, self.words)
        self.words += len(data) // 4


def _key(index: int) -> int:
    return ((index + 1) * MULTIPLIER & KEY_MASK) | 1

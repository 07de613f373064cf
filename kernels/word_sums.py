"""The word sum of equal-sized payloads in one launch: ``tfd.store.checksum``'s S, exactly.

Each program takes ``BLOCK`` words of one payload (a row of ``words``, int32 read unsigned), keys
them ``key(i) = ((i + 1) * 2654435761 mod 2**31) | 1`` from the payload's first word, and writes its
products' sums in 32-bit halves: each product is below 2**63, a half's sum over 2**31 words too, so
int64 never wraps. The caller adds the programs' halves (exact in int64). Torch does the same in
about a dozen passes over int64 temporaries (8.7 ms for a 30,000-token state on an H200); this is one
read of the bytes. ``reference`` is that torch form (the store's sum off a GPU), ``keys`` its keys.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MULTIPLIER = 2654435761
KEY_MASK = (1 << 31) - 1
LOW = (1 << 32) - 1
MAX_WORDS = 1 << 31  # (i + 1) * MULTIPLIER stays below 2**63
BLOCK = 4096  # words a program sums: 16 KiB read, a tile of int64 products in registers


# counts that vary call by call are not specialized on (1, multiples of 16): one variant meets them all
@triton.jit(do_not_specialize=["count", "stride", "chunks", "first"])
def _halves(words, partials, count, stride, chunks, first, BLOCK: tl.constexpr):
    row, chunk = tl.program_id(0), tl.program_id(1)
    at = chunk * BLOCK + tl.arange(0, BLOCK)
    inside = at < count
    word = tl.load(words + row.to(tl.int64) * stride + at, mask=inside, other=0).to(tl.int64) & 0xFFFFFFFF
    key = ((at.to(tl.int64) + first + 1) * 2654435761) & 0x7FFFFFFF | 1
    product = word * key
    place = (row.to(tl.int64) * chunks + chunk) * 2
    tl.store(partials + place, tl.sum(product >> 32, axis=0))
    tl.store(partials + place + 1, tl.sum(product & 0xFFFFFFFF, axis=0))


def halves(words: torch.Tensor, first: int = 0, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's S of ``words`` [rows, m] (int32, rows contiguous), keyed from word ``first`` (its
    keys' indices below 2**31), as int64 (high, low) halves [rows] whose ``high * 2**32 + low`` is S;
    queued on the current stream, not waited for."""
    if words.dim() != 2 or words.dtype != torch.int32 or words.stride(1) != 1:
        raise ValueError(f"words must be [rows, m] int32 with contiguous rows, got {words.dtype} "
                         f"{list(words.shape)} strides {words.stride()}")
    rows, count = words.shape
    if first < 0 or first + count > 1 << 31:
        raise ValueError(f"words {first} to {first + count} cannot be keyed: at most 2**31 words")
    chunks = max(1, triton.cdiv(count, block))
    partials = torch.empty(rows, chunks, 2, dtype=torch.int64, device=words.device)
    if rows:
        _halves[(rows, chunks)](words, partials, count, words.stride(0), chunks, first, BLOCK=block)
    summed = partials.sum(1)
    return summed[:, 0], summed[:, 1]


def keys(first: int, count: int, device: torch.device) -> torch.Tensor:
    """``key(first) .. key(first + count - 1)`` as int64 on ``device``."""
    if first + count > MAX_WORDS:
        raise ValueError(f"a payload of more than {MAX_WORDS} words cannot be summed")
    index = torch.arange(first + 1, first + count + 1, dtype=torch.int64, device=device)
    return index.mul_(MULTIPLIER).bitwise_and_(KEY_MASK).bitwise_or_(1)


def reference(words: torch.Tensor, first: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``halves`` by torch (int64 temporaries four times the words' size)."""
    products = words.to(torch.int64).bitwise_and_(LOW).mul_(keys(first, words.shape[1], words.device))
    return (products >> 32).sum(1), products.bitwise_and_(LOW).sum(1)

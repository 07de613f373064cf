"""Keys for the keyed draw's noise: the seed whose hash is a chosen value (splitmix64's finaliser undone),
so a test can put a token at either end of the noise's range."""

from __future__ import annotations

from tfd_kernels import sampling as keyed

MASK = (1 << 64) - 1


def _unshift(y: int, bits: int) -> int:
    """``x`` from ``y = x ^ (x >> bits)`` (64-bit)."""
    x, shift = y, bits
    while shift < 64:
        x, shift = x ^ (y >> shift), shift + bits
    return x & MASK


def seed_hashing_to(x: int) -> int:
    """The int64 seed whose key at position 0, token 0 the finaliser turns into ``x``."""
    x = _unshift(x, 31)
    x = _unshift(x * pow(keyed.M2, -1, 1 << 64) & MASK, 27)
    x = _unshift(x * pow(keyed.M1, -1, 1 << 64) & MASK, 30)
    seed = x * pow(keyed.SEED_MIX, -1, 1 << 64) & MASK
    return seed - (1 << 64) if seed >= 1 << 63 else seed

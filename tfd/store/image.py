"""A learned state's files as the store names and lists them: ``Image``, its key and its blocks' names.

A state at position p is a state file (its pieces) and row blocks of ``BLOCK_ROWS`` tokens, each
named by what its bytes are a function of: the prefix up to its end, the token after its end and
whether the MTP head's rows are in it, so states sharing a prefix share blocks. Where those bytes lie
in the pool is the cache's (``tfd.cache.image_bytes``).
"""

from __future__ import annotations

import hashlib
from typing import Any

import attrs

BLOCK_ROWS = 256


@attrs.frozen
class Image:
    """A kept state as the store writes it: its key, position, whether the MTP head's rows are in
    it, its pieces' names and bytes, and its row blocks' names and bytes, in row order."""

    key: str
    position: int
    head: bool
    pieces: tuple[tuple[str, int], ...]
    blocks: tuple[tuple[str, int], ...]

    @property
    def piece_bytes(self) -> int:
        return sum(size for _, size in self.pieces)

    @property
    def bytes(self) -> int:
        """Its blocks' bytes and its pieces': what ``Store.read`` fills."""
        return sum(size for _, size in self.blocks) + self.piece_bytes

    def words(self) -> dict[str, Any]:
        return {"key": self.key, "position": self.position, "head": self.head,
                "pieces": [list(p) for p in self.pieces], "blocks": [list(b) for b in self.blocks]}

    @classmethod
    def of(cls, words: dict[str, Any]) -> Image:
        return cls(words["key"], words["position"], words["head"],
                   tuple((n, s) for n, s in words["pieces"]), tuple((n, s) for n, s in words["blocks"]))


def state_key(position: int, digest: bytes, lookahead: int) -> str:
    """The store's name of a state: its position, the digest of the tokens before it, the token at it."""
    return f"{position:08x}{digest.hex()}{lookahead:08x}"


def block_name(digest: bytes, after: int, head: bool) -> str:
    """A block's name: the digest of the prefix it ends, the token after it, whether head rows are in it."""
    text = digest + after.to_bytes(4, "little") + bytes([head])
    return hashlib.blake2b(text, digest_size=16).hexdigest()

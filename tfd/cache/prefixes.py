"""Prompt prefixes as kept states see them: where a state may be kept, and digests that name prefixes.

A state is kept only at a multiple of ``CHUNK`` positions that prefill reached (prefill cuts its
GDN chunks there, so a state kept at p is the state a fresh prefill has at p, and a resumed lane
prefilling on from p cuts where a fresh one cuts). ``keep_points`` turns marks (the prompt's last
row, the start of its latest user message) into such positions. A prefix is named by a chain of
digests over ``CHUNK``-token pieces, so one pass over a prompt names all its keepable prefixes and a
lookup is a dictionary probe per position. ``Prefixes`` is a prompt as the cache sees it: its
tokens and, once asked, their digests. Pure Python.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Iterator, Sequence

import attrs

from tfd.model import GDN_CHUNK as CHUNK

DIGEST_BYTES = 16

Key = tuple[int, bytes, int]  # position, digest of the tokens before it, the token at it


def keep_points(prompt_length: int, marks: Iterable[int] = ()) -> tuple[int, ...]:
    """Where a lane of ``prompt_length`` prompt tokens keeps states: its last row and each mark in
    ``marks`` rounded down to a multiple of ``CHUNK``, at least one chunk in and short of the prompt's
    end (a kept state must leave a row to prefill, whose logits draw the next token)."""
    last = prompt_length - 1
    found = {m // CHUNK * CHUNK for m in (last, *marks) if 0 <= m <= last}
    return tuple(sorted(p for p in found if p >= CHUNK))


def key_at(prompt: Sequence[int], digests: Sequence[bytes], position: int) -> Key:
    """What names a state kept at ``position`` (a multiple of ``CHUNK``): the position, the digest of
    the tokens before it, the token at it."""
    return position, digests[position // CHUNK], prompt[position]


def keys_of(prompt: Sequence[int], digests: Sequence[bytes], above: int = 0) -> Iterator[Key]:
    """The names of the states ``prompt`` could resume from, longest first, past ``above`` tokens."""
    for chunk in range((len(prompt) - 1) // CHUNK, above // CHUNK, -1):
        yield key_at(prompt, digests, chunk * CHUNK)


def prefix_digests(tokens: Sequence[int], upto: int | None = None) -> list[bytes]:
    """``digests[i]`` names ``tokens[:i * CHUNK]``, for every whole chunk up to ``upto`` tokens (all of
    them by default): a chain of blake2b over each chunk's ids and the digest before."""
    end = len(tokens) if upto is None else min(upto, len(tokens))
    digests = [b"\0" * DIGEST_BYTES]
    for start in range(0, end - CHUNK + 1, CHUNK):
        piece = struct.pack(f"<{CHUNK}I", *tokens[start:start + CHUNK])
        digests.append(hashlib.blake2b(digests[-1] + piece, digest_size=DIGEST_BYTES).digest())
    return digests


@attrs.define
class Prefixes:
    """A prompt as the cache names it: its ``tokens`` and the digests of its prefixes that a state
    can be kept at (every whole chunk short of its last token), computed the first time asked."""

    tokens: Sequence[int]
    _digests: list[bytes] | None = attrs.field(default=None, init=False, repr=False)

    @property
    def digests(self) -> list[bytes]:
        if self._digests is None:
            self._digests = prefix_digests(self.tokens, len(self.tokens) - 1)
        return self._digests

    def key_at(self, position: int) -> Key:
        """What names a state kept at ``position`` (a multiple of ``CHUNK`` short of the prompt's end)."""
        return key_at(self.tokens, self.digests, position)

    def resume_keys(self, above: int = 0) -> Iterator[Key]:
        """The names of the states this prompt could resume from, longest first, past ``above`` tokens."""
        return keys_of(self.tokens, self.digests, above)

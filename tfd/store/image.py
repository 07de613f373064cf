"""A kept state as the disk store writes it: its pieces and its rows as device byte ranges.

A state at position p is written as its pieces (GDN states, conv tails, PLE tail and n-gram
history, in the order of its piece map) and its rows in blocks of 256 tokens: block b holds rows
``256 b .. min(256 (b + 1), p)`` of every row part in the pool's part order (each part's entries in
token order; a pooled part's one entry a block of its rows). A block is named by the tokens it is a
function of: the prefix up to its end (``tfd.engine.prefixes``), the token after its end (the MTP
head's last row read it) and whether the head's rows are in it, so states sharing a prefix share
blocks. The same ranges, taken from a lane's pages, are where a state read back goes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import torch

from tfd.engine.kept import KeptState
from tfd.model import GDN_CHUNK as CHUNK
from tfd.pool.pages import TORCH_DTYPES, Pool
from tfd.store.store import BLOCK_ROWS, Image


def state_key(position: int, digest: bytes, lookahead: int) -> str:
    """The store's name of a state: its position, the digest of the tokens before it, the token at it."""
    return f"{position:08x}{digest.hex()}{lookahead:08x}"


def block_name(digest: bytes, after: int, head: bool) -> str:
    """A block's name: the digest of the prefix it ends, the token after it, whether head rows are in it."""
    text = digest + after.to_bytes(4, "little") + bytes([head])
    return hashlib.blake2b(text, digest_size=16).hexdigest()


def row_ranges(pool: Pool, pages: Sequence[int], start: int, end: int) -> list[torch.Tensor]:
    """Rows ``start .. end`` (multiples of every part's entry rows) of the row pages ``pages`` (in
    row order), as pool byte ranges: every part in layout order, each its rows in token order."""
    layout, rows = pool.layout, pool.layout.page_rows
    ranges = []
    for part in layout.row_parts:
        at = start
        while at < end:
            index = at // rows
            stop = min(end, (index + 1) * rows)
            base = pages[index] * layout.page_bytes + layout.part_offsets[part.name]
            first, last = (at - index * rows) // part.rows, (stop - index * rows) // part.rows
            ranges.append(pool.buffer[base + first * part.entry_bytes:base + last * part.entry_bytes])
            at = stop
    return ranges


def block_bytes(pool: Pool, rows: int) -> int:
    """Bytes of ``rows`` rows of every row part."""
    return sum(rows // part.rows * part.entry_bytes for part in pool.layout.row_parts)


def piece_ranges(pieces: Sequence[tuple[str, torch.Tensor]]) -> list[torch.Tensor]:
    """State pieces (name, view) as byte ranges, in the order given."""
    return [view.view(torch.uint8).reshape(-1) for _, view in pieces]


def state_pages(state: KeptState) -> list[int]:
    """A kept state's row pages in row order: the shared ones, then those it copied."""
    pages = list(state.shared)
    for index, page in sorted(state.copied):
        assert index == len(pages), "a kept state's row pages are its shared ones, then its copies"
        pages.append(page)
    return pages


def image_of(pool: Pool, state: KeptState, digests: Sequence[bytes], prompt: Sequence[int]) -> Image:
    """``state``'s disk image; ``digests`` and ``prompt``: the prompt it was kept from."""
    position, digest, lookahead = state.key
    pieces = tuple((name, view.numel() * view.element_size()) for name, view in sorted(state.pieces.items()))
    blocks = []
    for start in range(0, position, BLOCK_ROWS):
        end = min(start + BLOCK_ROWS, position)
        name = block_name(digests[end // CHUNK], prompt[end], state.head)
        blocks.append((name, block_bytes(pool, end - start)))
    return Image(state_key(position, digest, lookahead), position, state.head, pieces, tuple(blocks))


def scatter(pool: Pool, image: Image, staged: torch.Tensor, pages: Sequence[int],
            pieces: Mapping[str, torch.Tensor]) -> None:
    """Place an image read back (``staged``: its bytes on the pool's device, blocks then pieces) in
    a lane: its rows into the row pages ``pages`` (in row order), its pieces into the views
    ``pieces``. Two launches a row part for the whole blocks, two for a last short one, one a piece."""
    layout, position = pool.layout, image.position
    table = torch.tensor(list(pages), dtype=torch.int64, device=staged.device)
    spans = [(0, position // BLOCK_ROWS, BLOCK_ROWS)] if position >= BLOCK_ROWS else []
    if position % BLOCK_ROWS:
        spans.append((position // BLOCK_ROWS, 1, position % BLOCK_ROWS))
    at = 0
    for first, count, rows in spans:
        size = block_bytes(pool, rows)
        region = staged[at:at + count * size].view(count, size)
        offset = 0
        for part in layout.row_parts:
            entries, per_page = rows // part.rows, layout.page_rows // part.rows
            width = entries * part.entry_bytes
            values = region[:, offset:offset + width].contiguous().view(TORCH_DTYPES[part.dtype])
            index = first * BLOCK_ROWS // part.rows + torch.arange(count * entries, device=staged.device)
            pool.rows(part.name)[table[index // per_page], index % per_page] = values.view(-1, *part.shape)
            offset += width
        at += count * size
    for name, size in image.pieces:
        pieces[name].view(torch.uint8).reshape(-1).copy_(staged[at:at + size])
        at += size

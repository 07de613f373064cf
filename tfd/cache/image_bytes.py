"""Where a learned state's bytes lie in the pool: a kept state's ranges to write, an image read back.

A state at position p is written as its pieces (GDN states, conv tails, PLE tail and n-gram
history, in the order of its piece map) and its rows in blocks of 256 tokens: block b holds rows
``256 b .. min(256 (b + 1), p)`` of every row part in the pool's part order (each part's entries in
token order; a pooled part's one entry a block of its rows), named as ``tfd.store.image`` says (the
prefix a block ends, by ``tfd.cache.prefixes``' digests). The same ranges, taken from a lane's
pages, are where a state read back goes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from tfd.cache.kept import KeptState
from tfd.cache.prefixes import Prefixes
from tfd.model import GDN_CHUNK as CHUNK
from tfd.pool.layout import RowPart
from tfd.pool.pages import Pool
from tfd.pool.views import TORCH_DTYPES
from tfd.store.image import BLOCK_ROWS, Image, block_name, state_key


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


def image_of(pool: Pool, state: KeptState, prompt: Prefixes) -> Image:
    """``state``'s disk image; ``prompt``: the prompt it was kept from."""
    position, digest, lookahead = state.key
    pieces = tuple((name, view.numel() * view.element_size()) for name, view in sorted(state.pieces.items()))
    blocks = []
    for start in range(0, position, BLOCK_ROWS):
        end = min(start + BLOCK_ROWS, position)
        name = block_name(prompt.digests[end // CHUNK], prompt.tokens[end], state.head)
        blocks.append((name, block_bytes(pool, end - start)))
    return Image(state_key(position, digest, lookahead), position, state.head, pieces, tuple(blocks))


def scatter(pool: Pool, image: Image, staged: torch.Tensor, pages: Sequence[int],
            pieces: Mapping[str, torch.Tensor]) -> None:
    """Place an image read back (``staged``: its bytes on the pool's device, blocks then pieces) in
    a lane: its rows into the row pages ``pages`` (in row order), its pieces into the views
    ``pieces``. Blocks of whole pages go a row part at a time, page by page (one indexed copy of
    8-byte words where the offsets allow); a short block that ends inside a page, entry by entry;
    one copy a piece."""
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
            if rows % layout.page_rows == 0:
                _place_pages(pool, part, region, offset, rows, first * BLOCK_ROWS // layout.page_rows, table)
            else:
                _place_entries(pool, part, region, offset, rows, first, table)
            offset += rows // part.rows * part.entry_bytes
        at += count * size
    for name, size in image.pieces:
        pieces[name].view(torch.uint8).reshape(-1).copy_(staged[at:at + size])
        at += size


def _place_pages(pool: Pool, part: RowPart, region: torch.Tensor, offset: int, rows: int, first_page: int,
                 table: torch.Tensor) -> None:
    """Row part ``part`` of blocks of ``rows`` rows, whole pages (``region``: [blocks, block bytes],
    the part at byte ``offset`` of each), into the lane's pages ``table[first_page:]``."""
    layout = pool.layout
    count, size = region.shape
    pages = rows // layout.page_rows  # a block's
    span = layout.page_rows // part.rows * part.entry_bytes  # the part's bytes in a page
    start = layout.part_offsets[part.name]
    wide = all(n % 8 == 0 for n in (span, offset, start, size, layout.page_bytes, region.storage_offset()))
    dtype, word = (torch.int64, 8) if wide else (torch.uint8, 1)
    target = pool.buffer.view(dtype).view(pool.pages + 1, layout.page_bytes // word)
    target = target[:, start // word:(start + span) // word]
    source = region.view(dtype)[:, offset // word:(offset + pages * span) // word]
    index = table[first_page + torch.arange(count * pages, device=table.device)].view(count, pages)
    target[index] = source.view(count, pages, span // word)


def _place_entries(pool: Pool, part: RowPart, region: torch.Tensor, offset: int, rows: int, first: int,
                   table: torch.Tensor) -> None:
    """Row part ``part`` of blocks of ``rows`` rows that end inside a page, entry by entry."""
    count = region.shape[0]
    entries, per_page = rows // part.rows, pool.layout.page_rows // part.rows
    # a fresh copy: the part's bytes need not sit at an offset its dtype can be viewed from
    values = region[:, offset:offset + entries * part.entry_bytes].reshape(-1).clone()
    index = first * BLOCK_ROWS // part.rows + torch.arange(count * entries, device=region.device)
    pool.rows(part.name)[table[index // per_page], index % per_page] = \
        values.view(TORCH_DTYPES[part.dtype]).view(-1, *part.shape)

"""A state read back is scattered into a lane's pages and pieces: the lane then holds the rows and
pieces the state was written from, byte for byte (whole blocks, a short last one, every row part,
pooled ones too), and nothing past its position."""

from __future__ import annotations

import pytest
import torch

from tfd.cache.image_bytes import block_bytes, piece_ranges, row_ranges, scatter
from tfd.pool.layout import Layout, RowPart
from tfd.pool.pages import Pool
from tfd.pool.pieces import Piece
from tfd.store.image import BLOCK_ROWS, Image

POSITION = 3 * BLOCK_ROWS + 128  # three whole blocks and a short one
PARTS = [RowPart("a.k", (2, 8), "bfloat16"), RowPart("a.v", (2, 8), "bfloat16"),
         RowPart("a.pooled", (8,), "float32", rows=4)]
# a part of one 2-byte entry every 128 rows leaves blocks a multiple of 4 bytes, not 8: copied in bytes
SPARSE = RowPart("a.sparse", (1,), "bfloat16", rows=128)
PIECES = [Piece("a.state", (4, 8), "float32"), Piece("a.tail", (3, 5), "bfloat16")]


def lane_bytes(pool: Pool, pages: list[int], pieces: dict[str, torch.Tensor], rows: int) -> bytes:
    parts = row_ranges(pool, pages, 0, rows) + piece_ranges(sorted(pieces.items()))
    return b"".join(bytes(part.numpy()) for part in parts)


@pytest.mark.parametrize(("page_rows", "parts"), [
    (64, PARTS),  # whole blocks and the short one cover whole pages: page by page, in 8-byte words
    (256, [*PARTS, SPARSE]),  # the short block ends inside a page: entry by entry; the rest in bytes
])
def test_a_state_scattered_into_a_lane_is_the_state_it_was_written_from(page_rows: int,
                                                                         parts: list[RowPart]) -> None:
    pool = Pool(Layout(page_rows, parts, PIECES), 64)
    generator = torch.Generator().manual_seed(3)
    pool.buffer.copy_(torch.randint(0, 256, pool.buffer.shape, generator=generator, dtype=torch.uint8))
    source = pool.promise(POSITION)
    source.take(POSITION)
    source_pieces = dict(source.take_state())
    blocks = [(f"b{start}", block_bytes(pool, min(BLOCK_ROWS, POSITION - start)))
              for start in range(0, POSITION, BLOCK_ROWS)]
    pieces = tuple((name, view.numel() * view.element_size()) for name, view in sorted(source_pieces.items()))
    image = Image("k", POSITION, False, pieces, tuple(blocks))
    written = [torch.cat(row_ranges(pool, source.row_pages, start, min(start + BLOCK_ROWS, POSITION)))
               for start in range(0, POSITION, BLOCK_ROWS)]  # each block as the writer writes it
    staged = torch.cat([*written, *piece_ranges(sorted(source_pieces.items()))])
    assert staged.numel() == image.bytes

    target = pool.promise(POSITION + 128)
    target.take(POSITION + 128)
    target_pieces = dict(target.take_state())
    placed = list(reversed(target.row_pages))  # a lane's pages need not be in the pool's order
    past = bytes(torch.cat(row_ranges(pool, placed, POSITION, POSITION + 128)).numpy())
    scatter(pool, image, staged, placed, target_pieces)

    assert lane_bytes(pool, placed, target_pieces, POSITION) == lane_bytes(pool, source.row_pages,
                                                                           source_pieces, POSITION)
    assert bytes(torch.cat(row_ranges(pool, placed, POSITION, POSITION + 128)).numpy()) == past

"""QSA's choice of positions from its block scores, a program a row: ``tfd.model.qsa.choose``'s rule
in one launch where torch takes about fifteen (two sorts and the masks and gathers between them).

A row at position p with ``complete = (p + 1) // block`` complete blocks takes its ``best`` highest
scoring blocks (a tie goes to the lower block; scores at or past ``complete`` are -inf), keeps the
ones below ``complete``, and then the incomplete tail ``complete * block .. p``. It writes the chosen
positions ascending (the kept blocks' positions, then the tail's), -1 after them, and their count.

How: each score becomes an integer that sorts as the float does, joined with its block number
(lower numbers sort first among equal scores) into one 64-bit key; one descending sort ranks the
blocks, a second sorts the best ``best`` numbers ascending. Integer keys make the order exact: the
same positions as torch's stable sorts, bit for bit, whatever else is in the launch.

Memory: reads a row's scores once, writes its positions and count. A program sorts the row's
blocks padded to a power of two in registers, so rows of more than ``MOST_BLOCKS`` blocks are left
to torch (``tfd.model.qsa.choose`` asks ``fits``). Grids follow the shapes alone (no host sync).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import pdl

MOST_BLOCKS = 8192  # a row's blocks one program sorts at most: 32k tokens of context in blocks of 4


@triton.jit
def _choose(scores, positions, out, counts, blocks, stride_s, stride_o, BEST: tl.constexpr,
            BLOCK: tl.constexpr, BLOCK_PAD: tl.constexpr, WIDTH: tl.constexpr, WIDTH_PAD: tl.constexpr,
            SORTED: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    row = tl.program_id(0)
    number = tl.arange(0, SORTED)
    score = tl.load(scores + row * stride_s + number, mask=number < blocks, other=float("-inf")) + 0.0
    bits = score.to(tl.int32, bitcast=True)  # (+ 0.0 made any -0.0 a 0.0, which torch's sort ties with it)
    ordered = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64)  # sorts as the floats do
    key = ordered * 4294967296 + (SORTED - 1 - number).to(tl.int64)  # among equals the lower number first
    ranked = SORTED - 1 - (tl.sort(key, descending=True) & 0xFFFFFFFF).to(tl.int32)
    rank = tl.arange(0, SORTED)
    best = tl.sort(tl.where(rank < BEST, ranked, SORTED))  # the best numbers, ascending, then SORTED

    position = tl.load(positions + row).to(tl.int32)
    complete = (position + 1) // BLOCK
    kept = tl.minimum(complete, BEST)  # the best are complete blocks first: they score above -inf
    members = tl.arange(0, BLOCK_PAD)
    columns = rank[:, None] * BLOCK + members[None, :]
    block_rows = (rank[:, None] < kept) & (members[None, :] < BLOCK)
    tl.store(out + row * stride_o + columns, best[:, None] * BLOCK + members[None, :], mask=block_rows)
    tail = position + 1 - complete * BLOCK
    rest = tl.arange(0, WIDTH_PAD)
    offset = rest - kept * BLOCK
    value = tl.where(offset < tail, complete * BLOCK + offset, -1)
    tl.store(out + row * stride_o + rest, value, mask=(offset >= 0) & (rest < WIDTH))
    tl.store(counts + row, kept * BLOCK + tail)


def fits(blocks: int) -> bool:
    """Whether a row of ``blocks`` block scores is chosen in one program."""
    return blocks <= MOST_BLOCKS


def choose(scored: torch.Tensor, positions: torch.Tensor, best: int, block: int
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """For scores [rows, blocks] (fp32, -inf past each row's complete blocks) at ``positions``
    [rows]: int32 [rows, best * block + block - 1] (positions ascending, then -1) and int32 counts."""
    rows, blocks = scored.shape
    if scored.dtype != torch.float32 or positions.shape != (rows,) or not fits(blocks) \
            or min(best, block) < 1:
        raise ValueError(f"scores {scored.dtype} {list(scored.shape)} at positions {list(positions.shape)}, "
                         f"best {best} of blocks of {block}: want fp32 [rows, at most {MOST_BLOCKS}], "
                         "[rows], and a block and a best of at least 1")
    width = best * block + block - 1
    out = torch.empty(rows, width, dtype=torch.int32, device=scored.device)
    counts = torch.empty(rows, dtype=torch.int32, device=scored.device)
    if rows:
        scored = scored if scored.stride(1) == 1 else scored.contiguous()
        _choose[(rows,)](scored, positions.contiguous(), out, counts, blocks, scored.stride(0), out.stride(0),
                         BEST=best, BLOCK=block, BLOCK_PAD=triton.next_power_of_2(block), WIDTH=width,
                         WIDTH_PAD=triton.next_power_of_2(width),
                         SORTED=max(triton.next_power_of_2(blocks), triton.next_power_of_2(best), 2),
                         **pdl.options(scored.device))
    return out, counts

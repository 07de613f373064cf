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

A row of more than ``MOST_BLOCKS`` blocks (a 32k prompt's page table holds 8,256) is too long to
sort in registers: ``_choose_long`` finds the best blocks' threshold by a radix select over the same
keys, a byte at a time, and takes the blocks in number order, so they come out ascending unsorted.
(Slices of a long row sorted by programs of their own, their best then sorted by the row's last, were
slower: H100, Flash Next at a 32k context, 2.10 ms a step against 1.70; docs/bench.md, 2026-12-07.)

Memory: a row up to ``MOST_BLOCKS`` reads its scores once, a long one five times by passes (in chunks
of ``LONG_CHUNK``); each writes its positions and count. Grids follow the shapes alone (no host sync).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import pdl

MOST_BLOCKS = 8192  # a row's blocks one program sorts in registers at most: 32k tokens in blocks of 4
# A longer row's blocks a pass of _choose_long reads at a time, and its program's warps (2,048 over 8: 8 keys
# a thread). One program a row: at a 32k context a decode step's choice is 25 chunks in turn a layer, so
# both are ints that tfd bench --variant sweeps (the chunks and warps change no choice).
LONG_CHUNK = 2048
LONG_WARPS = 8


@triton.jit
def _ordered(score):
    """A score's bits as an int64 that orders as the float does (-0.0 made 0.0 by the caller's + 0.0)."""
    bits = score.to(tl.int32, bitcast=True)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64)


@triton.jit
def _tail(out, counts, row, stride_o, position, complete, kept, BLOCK: tl.constexpr, WIDTH: tl.constexpr,
          WIDTH_PAD: tl.constexpr):
    """After a row's ``kept`` blocks: the incomplete tail ``complete * BLOCK .. position``, then -1 to
    the row's width, and the row's count (both forms of the choice end so)."""
    tail = position + 1 - complete * BLOCK
    rest = tl.arange(0, WIDTH_PAD)
    offset = rest - kept * BLOCK
    value = tl.where(offset < tail, complete * BLOCK + offset, -1)
    tl.store(out + row * stride_o + rest, value, mask=(offset >= 0) & (rest < WIDTH))
    tl.store(counts + row, kept * BLOCK + tail)


@triton.jit
def _write_best(out, counts, row, stride_o, best, rank, position, complete, BEST: tl.constexpr,
                BLOCK: tl.constexpr, BLOCK_PAD: tl.constexpr, WIDTH: tl.constexpr, WIDTH_PAD: tl.constexpr):
    """The row's kept blocks' positions (``best``: the best block numbers ascending, at ``rank``), then
    ``_tail``."""
    kept = tl.minimum(complete, BEST)  # the best are complete blocks first: they score above -inf
    members = tl.arange(0, BLOCK_PAD)
    columns = rank[:, None] * BLOCK + members[None, :]
    block_rows = (rank[:, None] < kept) & (members[None, :] < BLOCK)
    tl.store(out + row * stride_o + columns, best[:, None] * BLOCK + members[None, :], mask=block_rows)
    _tail(out, counts, row, stride_o, position, complete, kept, BLOCK, WIDTH, WIDTH_PAD)


# The block count and the rows' strides follow each lane's context: left unspecialized, or a count the warm-up
# never met divisible by 16 (or not) compiles a variant while serving (the H200 Flash Next demo did, twice).
@triton.jit(do_not_specialize=["blocks", "stride_s", "stride_o"])
def _choose(scores, positions, out, counts, blocks, stride_s, stride_o, BEST: tl.constexpr,
            BLOCK: tl.constexpr, BLOCK_PAD: tl.constexpr, WIDTH: tl.constexpr, WIDTH_PAD: tl.constexpr,
            SORTED: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    row = tl.program_id(0)
    number = tl.arange(0, SORTED)
    score = tl.load(scores + row * stride_s + number, mask=number < blocks, other=float("-inf")) + 0.0
    # (+ 0.0 made any -0.0 a 0.0, which torch's sort ties with it); among equals the lower number first
    key = _ordered(score) * 4294967296 + (SORTED - 1 - number).to(tl.int64)
    ranked = SORTED - 1 - (tl.sort(key, descending=True) & 0xFFFFFFFF).to(tl.int32)
    rank = tl.arange(0, SORTED)
    best = tl.sort(tl.where(rank < BEST, ranked, SORTED))  # the best numbers, ascending, then SORTED

    position = tl.load(positions + row).to(tl.int32)
    _write_best(out, counts, row, stride_o, best, rank, position, (position + 1) // BLOCK, BEST, BLOCK,
                BLOCK_PAD, WIDTH, WIDTH_PAD)


@triton.jit
def _keys(scores, row, stride_s, number, live):
    """The scores at ``number`` as int64 keys in [0, 2^32) that order as the floats do (-0.0 as 0.0)."""
    score = tl.load(scores + row * stride_s + number, mask=live, other=0.0) + 0.0
    return _ordered(score) + 2147483648


@triton.jit(do_not_specialize=["stride_s", "stride_o"])
def _choose_long(scores, positions, out, counts, stride_s, stride_o, BEST: tl.constexpr, BLOCK: tl.constexpr,
                 BLOCK_PAD: tl.constexpr, WIDTH: tl.constexpr, WIDTH_PAD: tl.constexpr, CHUNK: tl.constexpr,
                 PDL: tl.constexpr):
    """``_choose``'s positions for a row too long to sort in registers: the best blocks' threshold by
    a radix select (four passes over the complete blocks' keys, a byte at a time, counted in 256
    bins), then one pass in block order that takes the blocks above it and the lowest-numbered of
    those equal to it, each written at its running count: ascending with no sort."""
    pdl.wait(PDL)
    row = tl.program_id(0)
    position = tl.load(positions + row).to(tl.int32)
    complete = (position + 1) // BLOCK
    kept = tl.minimum(complete, BEST)
    bins = tl.arange(0, 256)
    prefix = tl.zeros((), tl.int64)  # the threshold's bytes found so far
    need = kept  # of the keys under that prefix, how many the best still take
    for step in tl.static_range(4):
        shift = 24 - 8 * step
        counted = tl.zeros((256,), tl.int32)
        for start in range(0, complete, CHUNK):
            number = start + tl.arange(0, CHUNK)
            live = number < complete
            key = _keys(scores, row, stride_s, number, live)
            under = live & ((key >> (shift + 8)) == prefix)
            counted += tl.histogram(((key >> shift) & 255).to(tl.int32), 256, mask=under)
        above = tl.sum(counted) - tl.cumsum(counted, axis=0)  # keys under the prefix with a higher byte
        byte = tl.min(tl.where(above < need, bins, 256))  # the byte where the best's last one lies
        need -= tl.sum(tl.where(bins == byte, above, 0))
        prefix = prefix * 256 + byte
    # prefix: the kept-th best key; need: how many of the keys equal to it the best take (the lowest numbers)
    taken = tl.zeros((), tl.int32)
    ties = tl.zeros((), tl.int32)
    members = tl.arange(0, BLOCK_PAD)
    for start in range(0, complete, CHUNK):
        number = start + tl.arange(0, CHUNK)
        live = number < complete
        key = _keys(scores, row, stride_s, number, live)
        equal = live & (key == prefix)
        tie_rank = ties + tl.cumsum(equal.to(tl.int32), axis=0) - equal.to(tl.int32)
        take = live & ((key > prefix) | (equal & (tie_rank < need)))  # none past a row of no complete block
        at = taken + tl.cumsum(take.to(tl.int32), axis=0) - take.to(tl.int32)
        columns = at[:, None] * BLOCK + members[None, :]
        tl.store(out + row * stride_o + columns, number[:, None] * BLOCK + members[None, :],
                 mask=take[:, None] & (members[None, :] < BLOCK))
        taken += tl.sum(take.to(tl.int32))
        ties += tl.sum(equal.to(tl.int32))
    _tail(out, counts, row, stride_o, position, complete, kept, BLOCK, WIDTH, WIDTH_PAD)


def choose(scored: torch.Tensor, positions: torch.Tensor, best: int, block: int, most: int | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """For scores [rows, blocks] (fp32, -inf past each row's complete blocks) at ``positions``
    [rows]: int32 [rows, best * block + block - 1] (positions ascending, then -1) and int32 counts.
    Rows of up to ``most`` blocks (``MOST_BLOCKS`` unless given) are sorted in registers, longer ones
    chosen by ``_choose_long``."""
    rows, blocks = scored.shape
    if scored.dtype != torch.float32 or positions.shape != (rows,) or min(best, block) < 1 \
            or blocks > 1 << 31:
        raise ValueError(f"scores {scored.dtype} {list(scored.shape)} at positions {list(positions.shape)}, "
                         f"best {best} of blocks of {block}: want fp32 [rows, blocks], [rows], and a "
                         "block and a best of at least 1")
    width = best * block + block - 1
    out = torch.empty(rows, width, dtype=torch.int32, device=scored.device)
    counts = torch.empty(rows, dtype=torch.int32, device=scored.device)
    scored = scored if scored.stride(1) == 1 else scored.contiguous()
    if rows and blocks > (MOST_BLOCKS if most is None else most):
        _choose_long[(rows,)](scored, positions.contiguous(), out, counts, scored.stride(0), out.stride(0),
                              BEST=best, BLOCK=block, BLOCK_PAD=triton.next_power_of_2(block), WIDTH=width,
                              WIDTH_PAD=triton.next_power_of_2(width), CHUNK=LONG_CHUNK, num_warps=LONG_WARPS,
                              **pdl.options(scored.device))
    elif rows:
        _choose[(rows,)](scored, positions.contiguous(), out, counts, blocks, scored.stride(0), out.stride(0),
                         BEST=best, BLOCK=block, BLOCK_PAD=triton.next_power_of_2(block), WIDTH=width,
                         WIDTH_PAD=triton.next_power_of_2(width),
                         SORTED=max(triton.next_power_of_2(blocks), triton.next_power_of_2(best), 2),
                         **pdl.options(scored.device))
    return out, counts

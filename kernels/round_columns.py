"""A verify round's bookkeeping in three launches: the page tables into the window's rows, the kept
count with the columns the head's cells read, and the next round's columns with the round's output.

A round (``tfd.engine.round_step``) works on its packed columns ([fields, lanes * rows] int64, a
lane's ``rows`` window rows side by side: token, position, visible keys, sampling key, temperature,
draw row, offsets, page table; ``tfd.model.decode_batch.Columns``). Around the layers it needs small integer
work a lane: its page table copied into its live rows, how many rows it keeps (its first, and each
draft while it equals the token drawn before it), the columns fed the drawn tokens, the next round's
window. torch took about 40 launches a round for these, ~1 us each and as long again between them in a
graph: a sixth of a one-stream round of the demo model on the H200. Each function below is one
launch, a program a lane, and ``reference_*`` is the same in torch (the CPU path and the tests'
reference: integers only, so the two agree exactly).

Memory: each program reads and writes only its own lane's columns and rows of the arguments named;
``advance`` reads a lane's columns before it writes them over. Grids follow shapes only: no host
sync, CUDA-graph safe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import pdl

TOKEN, POSITION, KEYS = 0, 1, 2  # fields of a column (``Columns``)
_TOKEN, _POSITION, _KEYS = tl.constexpr(TOKEN), tl.constexpr(POSITION), tl.constexpr(KEYS)  # for kernels


@triton.jit
def _tables(packed, tables, count, table_field, pages, null_page,
            ROWS: tl.constexpr, BLOCK_P: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    lane = tl.program_id(0)
    n = count * ROWS
    at = tl.arange(0, BLOCK_P)
    inside = at < pages
    table = tl.load(tables + at * count + lane, mask=inside)
    for r in tl.static_range(ROWS):
        column = lane * ROWS + r
        live = tl.load(packed + _KEYS * n + column) > 0
        tl.store(packed + (table_field + at) * n + column, tl.where(live, table, null_page), mask=inside)


@triton.jit
def _keep(packed, drawn, keep, keep32, last, fed, base, count, fields,
          ROWS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    lane = tl.program_id(0)
    n = count * ROWS
    r = tl.arange(0, BLOCK_R)
    first = lane * ROWS
    later = (r >= 1) & (r < ROWS)
    token = tl.load(packed + _TOKEN * n + first + r, mask=later, other=0)
    before = tl.load(drawn + first + r - 1, mask=later, other=-1)
    live = tl.load(packed + _KEYS * n + first + r, mask=later, other=0) > 0
    broken = later & ((token != before) | (live == 0))
    kept = tl.min(tl.where(broken, r, ROWS), axis=0)  # the first draft not held: rows before it kept
    tl.store(keep + lane, kept.to(tl.int64))
    tl.store(keep32 + lane, kept.to(tl.int32))
    end = first + kept - 1
    tl.store(last + lane, end.to(tl.int64))
    f = tl.arange(0, BLOCK_F)
    for start in range(0, fields, BLOCK_F):
        field = start + f
        inside = field < fields
        for row in tl.static_range(ROWS):
            value = tl.load(packed + field * n + first + row, mask=inside)
            value = tl.where(field == _TOKEN, tl.load(drawn + first + row), value)
            tl.store(fed + field * n + first + row, value, mask=inside)
        value = tl.load(packed + field * n + end, mask=inside)
        value = tl.where(field == _TOKEN, tl.load(drawn + end), value)
        tl.store(base + field * count + lane, value, mask=inside)


@triton.jit
def _advance(packed, drawn, keep, drafts, proposed, limits, padding, out, count, fields, last_row,
             ROWS: tl.constexpr, MOST: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr,
             PDL: tl.constexpr):
    pdl.wait(PDL)
    lane = tl.program_id(0)
    n = count * ROWS
    first = lane * ROWS
    r = tl.arange(0, BLOCK_R)
    window = r < ROWS
    width = tl.sum((tl.load(packed + _KEYS * n + first + r, mask=window, other=0) > 0).to(tl.int64), axis=0)
    kept = tl.load(keep + lane)
    chained = tl.load(proposed + lane)
    start = tl.load(packed + _POSITION * n + first) + kept
    on = tl.load(packed + _KEYS * n + first) > 0
    most = tl.minimum(tl.maximum(tl.minimum(chained, tl.load(limits + lane) - start), 0), MOST)
    # the round's output row: draws, kept count, drafts, how many proposed, the window's width
    size = ROWS + MOST + 3
    row = out + lane * size
    tl.store(row + r, tl.load(drawn + first + r, mask=window), mask=window)
    tl.store(row + ROWS, kept)
    d = tl.arange(0, BLOCK_R)
    chain = d < MOST
    tl.store(row + ROWS + 1 + d, tl.load(drafts + lane * MOST + d, mask=chain), mask=chain)
    tl.store(row + ROWS + 1 + MOST, chained)
    tl.store(row + ROWS + 2 + MOST, width)
    # the next window: the last kept draw, then the drafts the lane may take; padding rows after
    f = tl.arange(0, BLOCK_F)
    inside = f < fields
    fixed = tl.load(packed + f * n + first, mask=inside)  # every field but the first three carries on
    empty = tl.load(padding + f, mask=inside)
    pending = tl.load(drawn + first + kept - 1)
    for at in tl.static_range(ROWS):
        if at == 0:  # noqa: SIM108 (a constexpr branch: the first row loads nothing)
            token = pending
        else:
            token = tl.load(drafts + lane * MOST + at - 1)
        position = tl.minimum(start + at, last_row)
        value = tl.where(f == _TOKEN, token, tl.where(f == _POSITION, position,
                                                     tl.where(f == _KEYS, position + 1, fixed)))
        real = (at <= most) & on
        tl.store(packed + f * n + first + at, tl.where(real, value, empty), mask=inside)


def _fields_block(fields: int) -> int:
    return int(triton.next_power_of_2(fields))


def tables(packed: torch.Tensor, tables: torch.Tensor, rows: int, table_field: int, null_page: int) -> None:
    """Each lane's page table (``tables`` [pages, lanes]) into the table fields of its live rows of
    ``packed`` (visible keys above 0); a padding row's table stays the null page."""
    count = tables.shape[1]
    pages = packed.shape[0] - table_field
    _tables[(count,)](packed, tables, count, table_field, pages, null_page, ROWS=rows,
                      BLOCK_P=triton.next_power_of_2(pages), **pdl.options(packed.device))


def keep(packed: torch.Tensor, drawn: torch.Tensor, rows: int
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """After a round's draws (``drawn`` [lanes * rows]): each lane's kept rows (int64 and int32
    [lanes]), the column of its last kept row ([lanes]), the columns fed the drawn tokens (each row's
    head cell takes the token drawn after it) and those at each lane's last kept row ([fields,
    lanes])."""
    fields, n = packed.shape
    count = n // rows
    device = packed.device
    kept = torch.empty(count, dtype=torch.int64, device=device)
    kept32 = torch.empty(count, dtype=torch.int32, device=device)
    last = torch.empty(count, dtype=torch.int64, device=device)
    fed = torch.empty_like(packed)
    base = torch.empty(fields, count, dtype=torch.int64, device=device)
    block = min(_fields_block(fields), 256)
    _keep[(count,)](packed, drawn, kept, kept32, last, fed, base, count, fields, ROWS=rows,
                    BLOCK_R=triton.next_power_of_2(rows), BLOCK_F=block, **pdl.options(device))
    return kept, kept32, last, fed, base


def advance(packed: torch.Tensor, drawn: torch.Tensor, kept: torch.Tensor, drafts: torch.Tensor,
            proposed: torch.Tensor, limits: torch.Tensor, padding: torch.Tensor, last_row: int
            ) -> torch.Tensor:
    """The round's output [lanes, rows + most + 3] (draws, kept count, drafts, how many the chain
    proposes, the window's width), and ``packed`` overwritten with the next round's columns: each live
    lane at its first row not kept, fed its last kept draw, then the drafts it proposes within
    ``limits`` (the last position its window may reach); rows past them, and padding lanes, take
    ``padding``. Positions stop at ``last_row``. The page tables are left for ``tables``."""
    fields, n = packed.shape
    count, most = drafts.shape
    rows = n // count
    if rows != most + 1:
        raise ValueError(f"a round of {most} drafts a lane has windows of {most + 1} rows, got {rows}")
    out = torch.empty(count, rows + most + 3, dtype=torch.int64, device=packed.device)
    _advance[(count,)](packed, drawn, kept, drafts.contiguous(), proposed, limits, padding, out, count,
                       fields, last_row, ROWS=rows, MOST=most, BLOCK_R=triton.next_power_of_2(rows),
                       BLOCK_F=_fields_block(fields), **pdl.options(packed.device))
    return out


def reference_tables(packed: torch.Tensor, tables: torch.Tensor, rows: int, table_field: int,
                     null_page: int) -> None:
    """``tables`` in torch."""
    live = (packed[KEYS] > 0)[None, :]
    packed[table_field:] = torch.where(live, tables.repeat_interleave(rows, dim=1), null_page)


def reference_keep(packed: torch.Tensor, drawn: torch.Tensor, rows: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``keep`` in torch."""
    count = packed.shape[1] // rows
    tokens = packed[TOKEN].view(count, rows)
    draws = drawn.view(count, rows)
    real = (packed[KEYS] > 0).view(count, rows)
    holds = (tokens[:, 1:] == draws[:, :-1]) & real[:, 1:]
    kept = 1 + holds.long().cumprod(dim=1).sum(dim=1)
    last = torch.arange(count, device=packed.device) * rows + kept - 1
    fed = packed.clone()
    fed[TOKEN] = drawn
    return kept, kept.int(), last, fed, fed[:, last]


def reference_output(packed: torch.Tensor, drawn: torch.Tensor, kept: torch.Tensor, drafts: torch.Tensor,
                     proposed: torch.Tensor) -> torch.Tensor:
    """``advance``'s output row in torch, for windows of any width (an eager round's are the widest
    window's): the draws, kept count, drafts, how many proposed, the window's width."""
    count = drafts.shape[0]
    width = (packed[KEYS] > 0).view(count, -1).sum(dim=1)
    return torch.cat((drawn.view(count, -1), kept[:, None], drafts, proposed[:, None], width[:, None]), dim=1)


def reference_advance(packed: torch.Tensor, drawn: torch.Tensor, kept: torch.Tensor, drafts: torch.Tensor,
                      proposed: torch.Tensor, limits: torch.Tensor, padding: torch.Tensor, last_row: int
                      ) -> torch.Tensor:
    """``advance`` in torch."""
    fields, n = packed.shape
    count, most = drafts.shape
    rows = n // count
    out = reference_output(packed, drawn, kept, drafts, proposed)
    first = packed.view(fields, count, rows)[:, :, 0]
    pending = drawn.view(count, rows).gather(1, (kept - 1)[:, None])
    start = first[POSITION] + kept
    going = torch.clamp(torch.minimum(proposed, limits - start), 0, most)
    at = torch.arange(rows, device=packed.device)
    position = torch.clamp(start[:, None] + at, max=last_row)
    real = (at[None, :] <= going[:, None]) & (first[KEYS] > 0)[:, None]
    following = first[:, :, None].expand(fields, count, rows).clone()
    following[TOKEN] = torch.cat((pending, drafts[:, :rows - 1]), dim=1)
    following[POSITION] = position
    following[KEYS] = position + 1
    packed.copy_(torch.where(real[None], following, padding[:, None, None]).view(fields, n))
    return out

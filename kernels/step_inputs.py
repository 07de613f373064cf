"""A decode step's inputs in one launch: each lane's embedding row, its rotary angles, and the page
table and visible keys as int32, gathered from the step's packed batch.

A decode step starts from ``tfd.model.decode_batch.DecodeBatch.packed`` ([fields, lanes] int64: token,
position, visible keys, ..., page table). torch takes ten small launches to turn it into what the
layers read (the embedding gather, the angles' product, concatenation, cos, sin and casts, two
int32 copies), about 20 us a step on the H200 at one lane; this takes one. The angles come from
per-position tables made once by the same torch expression (``Rotary.angles`` of every position),
so a gathered row is the bits that expression gives at that position.

A token field below zero names the token the last decode step drew for another row: -(row + 1) is
``feed[row]`` (the draws the decode step writes, so a step launched before the host has seen the last
one's tokens is fed on the device, with no copy between the two); the resolved token is written back
into the field, where the step's later readers (PLE's n-grams) find it.

Memory: reads the packed fields, one embedding row and one row of each angle table a lane, and a fed
lane's ``feed`` entry; writes the five outputs and fed lanes' token fields, nothing else. Tokens must
be below the vocabulary, fed rows below the feed's and positions below the tables' rows (the engine
admits nothing else). Grids follow shapes only: no host sync, CUDA-graph safe.
"""

from __future__ import annotations

import attrs
import torch
import triton
import triton.language as tl

from tfd_kernels import pdl

BLOCK = 1024  # embedding columns (or page-table entries) a program copies


@attrs.frozen
class StepInputs:
    x: torch.Tensor  # [lanes, hidden]: each lane's token's embedding row
    cos: torch.Tensor  # [lanes, dim]: the angle tables' rows at each lane's position
    sin: torch.Tensor
    table: torch.Tensor  # [lanes, pages] int32, contiguous
    lengths: torch.Tensor  # [lanes] int32: visible keys


# counts that vary call by call are not specialized on (1, multiples of 16): one variant meets them all
@triton.jit(do_not_specialize=["stride_f", "pages"])
def _gather(packed, stride_f, stride_l, embed, stride_e, cos_table, sin_table, stride_t, x, stride_x, cos,
            sin, stride_a, table, stride_tb, lengths, hidden, dim, pages, table_field, feed,
            EMBED_TILES: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, FEED: tl.constexpr,
            PDL: tl.constexpr):
    pdl.wait(PDL)
    lane, tile = tl.program_id(0), tl.program_id(1)
    fields = packed + lane * stride_l
    if tile < EMBED_TILES:
        token = tl.load(fields)
        if FEED:  # -(row + 1): the last step's draw at that row (every embedding tile resolves it alike)
            fed = token < 0
            token = tl.where(fed, tl.load(feed + tl.where(fed, -token - 1, 0)), token)
            if tile == 0:
                tl.store(fields, token)
        cols = tile * BLOCK + tl.arange(0, BLOCK)
        keep = cols < hidden
        tl.store(x + lane * stride_x + cols, tl.load(embed + token * stride_e + cols, mask=keep), mask=keep)
    elif tile == EMBED_TILES:
        position = tl.load(fields + stride_f)
        d = tl.arange(0, BLOCK_D)  # names apart from the other branches': Triton merges them by name
        live = d < dim
        angle = position * stride_t + d
        tl.store(cos + lane * stride_a + d, tl.load(cos_table + angle, mask=live), mask=live)
        tl.store(sin + lane * stride_a + d, tl.load(sin_table + angle, mask=live), mask=live)
        tl.store(lengths + lane, tl.load(fields + 2 * stride_f).to(tl.int32))
    else:
        entry = (tile - EMBED_TILES - 1) * BLOCK + tl.arange(0, BLOCK)
        held = entry < pages
        entries = tl.load(fields + (table_field + entry) * stride_f, mask=held)
        tl.store(table + lane * stride_tb + entry, entries.to(tl.int32), mask=held)


def _check(packed: torch.Tensor, table_field: int, embed: torch.Tensor, cos_table: torch.Tensor,
           sin_table: torch.Tensor, feed: torch.Tensor | None) -> None:
    if packed.dim() != 2 or packed.dtype != torch.int64 or not 3 <= table_field <= packed.shape[0]:
        raise ValueError(f"packed must be int64 [fields, lanes] with the page table from field {table_field} "
                         f"(at least 3), got {packed.dtype} {list(packed.shape)}")
    if embed.dim() != 2 or embed.stride(1) != 1:
        raise ValueError(f"embed must be [vocab, hidden] with unit column stride, got {list(embed.shape)} "
                         f"strides {embed.stride()}")
    if (cos_table.shape != sin_table.shape or cos_table.dim() != 2 or not cos_table.is_contiguous()
            or not sin_table.is_contiguous() or cos_table.dtype != sin_table.dtype):
        raise ValueError(f"the angle tables must be contiguous [positions, dim] of one shape and dtype, got "
                         f"{list(cos_table.shape)} {cos_table.dtype} and "
                         f"{list(sin_table.shape)} {sin_table.dtype}")
    if feed is not None and (feed.dim() != 1 or feed.dtype != torch.int64 or not feed.numel()
                             or feed.stride(0) != 1):
        raise ValueError(f"feed must be contiguous int64 [rows] (at least one), got {feed.dtype} "
                         f"{list(feed.shape)}")


def gather(packed: torch.Tensor, table_field: int, embed: torch.Tensor, cos_table: torch.Tensor,
           sin_table: torch.Tensor, feed: torch.Tensor | None = None) -> StepInputs:
    """The step's inputs from ``packed`` [fields, lanes] (field 0 the tokens, 1 the positions, 2 the
    visible keys, ``table_field`` onwards the page table) and the angle tables [positions, dim]; with
    ``feed``, a token -(row + 1) is ``feed[row]``, written back into the token field (the row must be
    below ``len(feed)``). Raises ValueError for shapes or dtypes that do not fit."""
    _check(packed, table_field, embed, cos_table, sin_table, feed)
    lanes, hidden, dim = packed.shape[1], embed.shape[1], cos_table.shape[1]
    pages = packed.shape[0] - table_field
    device = packed.device
    out = StepInputs(torch.empty(lanes, hidden, dtype=embed.dtype, device=device),
                     torch.empty(lanes, dim, dtype=cos_table.dtype, device=device),
                     torch.empty(lanes, dim, dtype=cos_table.dtype, device=device),
                     torch.empty(lanes, pages, dtype=torch.int32, device=device),
                     torch.empty(lanes, dtype=torch.int32, device=device))
    if lanes == 0:
        return out
    embed_tiles = triton.cdiv(hidden, BLOCK)
    _gather[(lanes, embed_tiles + 1 + triton.cdiv(pages, BLOCK))](
        packed, packed.stride(0), packed.stride(1), embed, embed.stride(0), cos_table, sin_table,
        cos_table.stride(0), out.x, out.x.stride(0), out.cos, out.sin, out.cos.stride(0), out.table,
        out.table.stride(0), out.lengths, hidden, dim, pages, table_field, packed if feed is None else feed,
        EMBED_TILES=embed_tiles, BLOCK=BLOCK, BLOCK_D=triton.next_power_of_2(dim), FEED=feed is not None,
        **pdl.options(device))
    return out


def fed_tokens(tokens: torch.Tensor, feed: torch.Tensor) -> torch.Tensor:
    """``tokens`` with each -(row + 1) replaced by ``feed[row]`` (torch, no host sync)."""
    return torch.where(tokens < 0, feed[(-tokens - 1).clamp(min=0)], tokens)


def reference(packed: torch.Tensor, table_field: int, embed: torch.Tensor, cos_table: torch.Tensor,
              sin_table: torch.Tensor, feed: torch.Tensor | None = None) -> StepInputs:
    """``gather`` in torch (fed tokens written back into ``packed`` as it does)."""
    _check(packed, table_field, embed, cos_table, sin_table, feed)
    if feed is not None:
        packed[0] = fed_tokens(packed[0], feed)
    tokens, positions = packed[0], packed[1]
    return StepInputs(embed[tokens], cos_table[positions], sin_table[positions],
                      packed[table_field:].T.to(torch.int32, memory_format=torch.contiguous_format),
                      packed[2].to(torch.int32))

"""A QSA layer's index keys at decode rows, in two launches where torch took about forty a layer.

``store``: each row's raw index key into ``index`` at its lane's last position (``lengths[r] - 1``,
through its page table row); a padding row (length 0) stores nothing. ``pool``: where that position
ends a block of ``block`` positions, the block's raw keys read back from ``index`` (the row's own
among them), summed in fp32 in position order, divided and rounded, then normalised and rotated at
the block's first position and stored into ``pooled`` at the block's entry. The arithmetic is
``tfd.model.qsa.pool_blocks``' with ``tfd_kernels.rope.norm_rope`` (its ``one`` itself, the same
cast points), so a block pooled here has the bits of one pooled in a span's prefill. Two launches,
not one: a verify window's rows of one lane complete blocks whose earlier keys other programs store.

The angles are rows of tables made once for every position (``tfd.model.decode.DecodeMemory
.angle_tables``: ``Rotary.angles``' values). Memory: ``pool`` rounds each mean into ``scratch``
[rows, dim] for the norm to read back (the rotation reads each value's partner); nothing else is
allocated. Grids follow shapes only (no host sync), so both are captured in the decode graphs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import pdl
from tfd_kernels import rope as rope_kernel


@triton.jit
def _store(keys, index, page_table, lengths, dim, page_rows, stride_k, stride_t, stride_ip, stride_ir,
           BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    row = tl.program_id(0)
    length = tl.load(lengths + row)
    if length > 0:
        position = length - 1
        page = tl.load(page_table + row * stride_t + position // page_rows).to(tl.int64)
        dims = tl.arange(0, BLOCK)
        live = dims < dim
        key = tl.load(keys + row * stride_k + dims, mask=live)
        tl.store(index + page * stride_ip + (position % page_rows) * stride_ir + dims, key, mask=live)


@triton.jit
def _raw(index, page_table, row, position, page_rows, stride_t, stride_ip, stride_ir, dims, live):
    """The raw key at ``position`` of row ``row``'s lane, in fp32."""
    page = tl.load(page_table + row * stride_t + position // page_rows).to(tl.int64)
    at = index + page * stride_ip + (position % page_rows) * stride_ir + dims
    return tl.load(at, mask=live, other=0.0).to(tl.float32)


@triton.jit
def _pool(index, pooled, page_table, lengths, weight, cos, sin, scratch, dim, rotary, page_rows, entries,
          stride_t, stride_ip, stride_ir, stride_pp, stride_pe, stride_c, eps, RATIO: tl.constexpr,
          BLOCK: tl.constexpr, LOADS_FIRST: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    row = tl.program_id(0)
    length = tl.load(lengths + row)
    if (length > 0) & (length % RATIO == 0):  # the row's position, length - 1, ends a block
        first = length - RATIO
        dims = tl.arange(0, BLOCK)
        live = dims < dim
        total = _raw(index, page_table, row, first, page_rows, stride_t, stride_ip, stride_ir, dims, live)
        for member in tl.static_range(1, RATIO):  # in position order, as pool_blocks adds them
            total += _raw(index, page_table, row, first + member, page_rows, stride_t, stride_ip, stride_ir,
                          dims, live)
        mean = scratch + row * dim
        tl.store(mean + dims, (total / RATIO).to(scratch.dtype.element_ty), mask=live)
        tl.debug_barrier()  # every thread's part of the mean stored before the norm reads partners
        block = length // RATIO - 1
        page = tl.load(page_table + row * stride_t + block // entries).to(tl.int64)
        dest = pooled + page * stride_pp + (block % entries) * stride_pe
        rope_kernel.one(mean, weight, cos + first * stride_c, sin + first * stride_c, dest, dim, rotary, 0, 0,
                        stride_c, eps, 0, 0, BLOCK, LOADS_FIRST)


def _check(index: torch.Tensor, page_table: torch.Tensor, lengths: torch.Tensor) -> None:
    if index.dim() != 3 or index.stride(2) != 1:
        raise ValueError(f"index must be [pages, rows a page, dim] with unit last stride, got "
                         f"{list(index.shape)} strides {index.stride()}")
    if page_table.dim() != 2 or page_table.dtype != torch.int32 or page_table.stride(1) != 1:
        raise ValueError(f"page_table must be int32 [lanes, pages] with unit column stride, got "
                         f"{page_table.dtype} {list(page_table.shape)}")
    if lengths.shape != (page_table.shape[0],) or lengths.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"lengths is {lengths.dtype} {list(lengths.shape)}, expected int32 or int64 "
                         f"[{page_table.shape[0]}]")


def store(keys: torch.Tensor, index: torch.Tensor, page_table: torch.Tensor, lengths: torch.Tensor) -> None:
    """Row r of ``keys`` [rows, dim] into ``index`` [pages, page_rows, dim] at position
    ``lengths[r] - 1`` of the lane whose page table row is ``page_table[r]``; none where it is 0."""
    _check(index, page_table, lengths)
    rows, dim = keys.shape
    if keys.shape != (lengths.shape[0], index.shape[2]) or keys.stride(1) != 1 or keys.dtype != index.dtype:
        raise ValueError(f"keys {keys.dtype} {list(keys.shape)} do not fit index {index.dtype} "
                         f"{list(index.shape)} and {lengths.shape[0]} rows (unit column stride)")
    if rows:
        _store[(rows,)](keys, index, page_table, lengths, dim, index.shape[1], keys.stride(0),
                        page_table.stride(0), index.stride(0), index.stride(1),
                        BLOCK=triton.next_power_of_2(dim), **pdl.options(keys.device))


def pool(index: torch.Tensor, pooled: torch.Tensor, page_table: torch.Tensor, lengths: torch.Tensor,
         weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float, block: int) -> None:
    """For each row r whose position ``lengths[r] - 1`` ends a block of ``block`` positions, that
    block's pooled key (mean of its raw keys in ``index``, rounded, ``weight``'s zero-centred norm,
    rotated by the angles ``cos``/``sin`` [positions, rotary] at its first position) into ``pooled``
    [pages, entries, dim] at the block's entry; nothing for other rows."""
    _check(index, page_table, lengths)
    rows, dim = lengths.shape[0], index.shape[2]
    if pooled.dim() != 3 or pooled.shape[2] != dim or pooled.stride(2) != 1 or pooled.dtype != index.dtype:
        raise ValueError(f"pooled {pooled.dtype} {list(pooled.shape)} does not fit index {index.dtype} "
                         f"{list(index.shape)}")
    rotary = cos.shape[1]
    if weight.shape != (dim,) or cos.dim() != 2 or sin.shape != cos.shape or rotary % 2 or rotary > dim \
            or cos.stride(1) != 1 or sin.stride() != cos.stride() or block < 1:
        raise ValueError(f"weight {list(weight.shape)}, cos {list(cos.shape)}, sin {list(sin.shape)} or "
                         f"block {block} do not fit keys of {dim}")
    if rows:
        scratch = torch.empty(rows, dim, dtype=index.dtype, device=index.device)
        _pool[(rows,)](index, pooled, page_table, lengths, weight, cos, sin, scratch, dim, rotary,
                       index.shape[1], pooled.shape[1], page_table.stride(0), index.stride(0),
                       index.stride(1), pooled.stride(0), pooled.stride(1), cos.stride(0), eps, RATIO=block,
                       BLOCK=triton.next_power_of_2(dim), LOADS_FIRST=rope_kernel.LOADS_FIRST,
                       **pdl.options(index.device))


def reference(keys: torch.Tensor, index: torch.Tensor, pooled: torch.Tensor, page_table: torch.Tensor,
              lengths: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float,
              block: int) -> None:
    """``store`` then ``pool`` composed as the span path composes them: torch's indexed stores (the
    lengths read to the host), each block's mean in fp32 in position order, rounded, then
    ``tfd_kernels.rope.norm_rope`` at the block's first position, stored."""
    _check(index, page_table, lengths)
    page_rows, entries = index.shape[1], pooled.shape[1]
    table = page_table.long()

    def slot(row: int, position: int) -> tuple[torch.Tensor, int]:
        return table[row, position // page_rows], position % page_rows

    for row, length in enumerate(lengths.tolist()):
        if length > 0:
            index[slot(row, length - 1)] = keys[row]
    for row, length in enumerate(lengths.tolist()):
        if length > 0 and length % block == 0:
            first = length - block
            total = index[slot(row, first)].float()
            for position in range(first + 1, length):
                total = total + index[slot(row, position)].float()
            mean = (total / block).to(index.dtype)
            angles = slice(first, first + 1)
            normed = rope_kernel.norm_rope(mean[None, None, :], weight, cos[angles], sin[angles], eps)
            number = length // block - 1
            pooled[table[row, number // entries], number % entries] = normed[0, 0]

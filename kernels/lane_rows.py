"""Store one row per lane into the pool at the lane's element offset; a padding lane stores nothing.

A batched decode step moves small per-lane pieces of the pool in place: Flash Next's PLE conv tail
and n-gram history (piece views), a QSA layer's raw index key and, when the row completes a block,
its pooled key (row parts, addressed through the page table). The step computes each lane's
destination on the device as an element offset from the first element of ``into`` (a view of the
pool's bytes in the rows' dtype), -1 where the lane stores nothing (a padding lane, a row that
completes no block). torch's indexed stores cannot skip a lane without a host sync, so this does.

Memory: reads ``values`` and ``at``, writes ``into[at[l] : at[l] + width]`` for each lane with
``at[l] >= 0``; nothing else. Grids follow shapes only: no host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import pdl

BLOCK = 1024  # columns a program stores


@triton.jit
def _store(values, into, at, width, stride_vl, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    lane, tile = tl.program_id(0), tl.program_id(1)
    offset = tl.load(at + lane)
    if offset >= 0:
        columns = tile * BLOCK + tl.arange(0, BLOCK)
        keep = columns < width
        row = tl.load(values + lane * stride_vl + columns, mask=keep)
        tl.store(into + offset + columns, row, mask=keep)


def _check(values: torch.Tensor, into: torch.Tensor, at: torch.Tensor) -> None:
    if values.dim() != 2 or values.stride(1) != 1:
        raise ValueError(f"values must be [lanes, width] with unit column stride, got {list(values.shape)} "
                         f"strides {values.stride()}")
    if at.shape != (values.shape[0],) or at.dtype != torch.int64:
        raise ValueError(f"at is {at.dtype} {list(at.shape)}, expected int64 [{values.shape[0]}]")
    if into.dtype != values.dtype:
        raise ValueError(f"into is {into.dtype} but values are {values.dtype}")


def store(values: torch.Tensor, into: torch.Tensor, at: torch.Tensor) -> None:
    """Row l of ``values`` [lanes, width] into ``into``'s memory from element ``at[l]`` (int64, counted
    from ``into``'s first element), for every lane with ``at[l] >= 0``."""
    _check(values, into, at)
    lanes, width = values.shape
    if lanes == 0 or width == 0:
        return
    _store[(lanes, triton.cdiv(width, BLOCK))](values, into, at, width, values.stride(0), BLOCK=BLOCK,
                                               **pdl.options(values.device))


def reference(values: torch.Tensor, into: torch.Tensor, at: torch.Tensor) -> None:
    """``store`` in torch, a lane at a time (the offsets read back to the host)."""
    _check(values, into, at)
    width = values.shape[1]
    flat = into.as_strided((width + max([0, *at.tolist()]),), (1,))
    for lane, offset in enumerate(at.tolist()):
        if offset >= 0:
            flat[offset:offset + width] = values[lane]

"""QSA's block scores: for each query row, every pooled block of its lane, read through the page table.

Row r (lane ``lane_of[r]``) scores block b as sum over index heads h, in head order, of
relu(q[r, h] . K_b), divided by sqrt(dim), in fp32 (reference/model.md 3.4); blocks at or past
``complete[r]`` (not yet complete for that row) score -inf so a sort puts them last. Pooled keys sit
in the layer's pooled part ``[pages + 1, entries a page, dim]``, block b at page
``page_table[lane, b // entries]``, entry ``b % entries``.

A row's scores depend on its query and its lane's blocks alone, never on the other rows or on how
many blocks the call scores: one program a (row, tile of blocks) computes each dot product with the
same reduction, whose shape is fixed by the head dim. So the prompt path (a lane's complete blocks)
and the decode step (every lane padded to its page table's blocks) give the same bits.

Memory: reads q, the page-table entries and pooled keys of visible blocks (none for the others),
writes ``out``. Grids follow shapes only: no host sync.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tfd_kernels import pdl

BLOCKS = 32  # blocks a program scores


# the blocks a row scores (its output's row stride too) grow with the context: not specialized on
@triton.jit(do_not_specialize=["blocks", "stride_or"])
def _scores(q, pooled, page_table, lane_of, complete, out, root, blocks, stride_qr, stride_qh, stride_pp,
            stride_pe, stride_tb, stride_or, ENTRIES: tl.constexpr, HEADS: tl.constexpr, DIM: tl.constexpr,
            DIM_PAD: tl.constexpr, BLOCKS: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    row, tile = tl.program_id(0), tl.program_id(1)
    lane = tl.load(lane_of + row)
    done = tl.load(complete + row)
    numbers = tile * BLOCKS + tl.arange(0, BLOCKS)
    visible = numbers < done
    dims = tl.arange(0, DIM_PAD)
    live = dims < DIM
    pages = tl.load(page_table + lane * stride_tb + numbers // ENTRIES, mask=visible, other=0).to(tl.int64)
    where = pages[:, None] * stride_pp + (numbers % ENTRIES)[:, None] * stride_pe + dims[None, :]
    keys = tl.load(pooled + where, mask=visible[:, None] & live[None, :], other=0.0).to(tl.float32)
    total = tl.zeros((BLOCKS,), tl.float32)
    for head in tl.static_range(HEADS):
        query = tl.load(q + row * stride_qr + head * stride_qh + dims, mask=live, other=0.0).to(tl.float32)
        total += tl.maximum(tl.sum(keys * query[None, :], axis=1), 0.0)
    total = tl.where(visible, total / root, float("-inf"))
    tl.store(out + row * stride_or + numbers, total, mask=numbers < blocks)


def _check(q: torch.Tensor, pooled: torch.Tensor, page_table: torch.Tensor, lane_of: torch.Tensor,
           complete: torch.Tensor) -> None:
    if q.dim() != 3 or pooled.dim() != 3 or pooled.shape[2] != q.shape[2]:
        raise ValueError(f"q must be [rows, heads, dim] and pooled [pages + 1, entries, dim], got "
                         f"{list(q.shape)} and {list(pooled.shape)}")
    if page_table.dim() != 2 or page_table.dtype != torch.int32:
        raise ValueError(f"page_table must be int32 [lanes, pages], got {page_table.dtype} "
                         f"{list(page_table.shape)}")
    for name, t in (("lane_of", lane_of), ("complete", complete)):
        if t.shape != (q.shape[0],) or t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} is {t.dtype} {list(t.shape)}, expected int32 or int64 [{q.shape[0]}]")


def scores(q: torch.Tensor, pooled: torch.Tensor, page_table: torch.Tensor, lane_of: torch.Tensor,
           complete: torch.Tensor, blocks: int) -> torch.Tensor:
    """fp32 [rows, blocks]: row r's score of each of its lane's first ``blocks`` blocks (-inf from
    ``complete[r]`` on), for ``q`` [rows, heads, dim] (any float dtype, unit stride along dim)."""
    _check(q, pooled, page_table, lane_of, complete)
    rows, heads, dim = q.shape
    out = torch.empty(rows, blocks, dtype=torch.float32, device=q.device)
    if rows == 0 or blocks == 0:
        return out
    if q.stride(2) != 1 or pooled.stride(2) != 1:
        raise ValueError("q and pooled need a unit stride along dim")
    page_table = page_table.contiguous()
    _scores[(rows, triton.cdiv(blocks, BLOCKS))](
        q, pooled, page_table, lane_of.contiguous(), complete.contiguous(), out, math.sqrt(dim), blocks,
        q.stride(0), q.stride(1), pooled.stride(0), pooled.stride(1), page_table.stride(0), out.stride(0),
        ENTRIES=pooled.shape[1], HEADS=heads, DIM=dim, DIM_PAD=triton.next_power_of_2(dim), BLOCKS=BLOCKS,
        num_warps=4, **pdl.options(q.device))
    return out


def reference(q: torch.Tensor, pooled: torch.Tensor, page_table: torch.Tensor, lane_of: torch.Tensor,
              complete: torch.Tensor, blocks: int) -> torch.Tensor:
    """``scores`` in torch: each dot product a sum along the last axis (the same at every position
    on the CPU), the heads' ReLUs added in head order."""
    _check(q, pooled, page_table, lane_of, complete)
    numbers = torch.arange(blocks, device=q.device)
    entries = pooled.shape[1]
    pages = page_table[lane_of.long()][:, numbers // entries].long()
    keys = pooled[pages, numbers % entries].float()  # [rows, blocks, dim]
    products = (q.float()[:, :, None, :] * keys[:, None, :, :]).sum(dim=-1)  # [rows, heads, blocks]
    total = torch.relu(products[:, 0])
    for head in range(1, q.shape[1]):
        total = total + torch.relu(products[:, head])
    total = total / math.sqrt(q.shape[2])
    return torch.where(numbers[None, :] < complete[:, None], total, float("-inf"))

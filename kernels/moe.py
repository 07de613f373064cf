"""The routed experts of an MoE layer: for each row, sum over its k experts in ascending expert id of
``weight * down_e(h)``, h = silu(gate_e(x)) * up_e(x) computed in fp32 and cast to the model dtype
(as a model-dtype linear hands it on); the sum is fp32, the result cast to x's dtype.

Memory: each selected expert's ``gate_up`` and ``down`` weights are read once per tile of
``BLOCK_M`` (row, slot) pairs that chose it, so once per call at decode sizes; an expert no row
chose is never touched. Beside the weights a call writes and reads back ``h`` (pairs x inner,
model dtype), an fp32 buffer of one hidden vector per pair, and int32 tables, sized by shapes alone.

The pairs are grouped by expert on the device with no host sync: per-block histograms
(``_count``), their prefix over blocks (``_scan``) and a stable placement (``_place``) give each
pair its position in expert order; when all pairs fit one block, ``_plan_one`` does it in one
launch. Every grid is fixed by the shapes (an upper bound on the tiles; a program past the last
tile exits at once), so a call can be captured in a CUDA graph. ``_gate_up`` computes h for a tile
of pairs sharing an expert; ``_down`` multiplies h by the expert's down weight and the routing
weight into the pair's buffer row, ranked by expert id within its row; ``_combine`` sums a row's
ranks in order.

Batch invariance: a pair's products run over ``hidden`` and ``inner`` in tiles and an order fixed
by the weight shapes (a dot's row is the same whatever rows share its tile); its rank depends on
its own row alone; the sum over a row's experts is a loop in ascending id. Nothing depends on the
number of rows or on how many pairs chose an expert, and nothing is summed by atomics.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import INTERPRETED, pdl, router
from kernels.sigmoid_gate import gated, sigmoid_gate

BLOCK_M = 16  # pairs in a tile: one tensor-core row block
GATE_N, GATE_K, GATE_STAGES = 64, 128, 4  # stage one: columns, reduction step, pipeline depth (H200 sweep)
DOWN_N, DOWN_K, DOWN_STAGES = 128, 64, 3  # the same for stage two
PLAN_BLOCK = 128  # pairs a placement program takes
SCAN_BLOCK = 8  # histogram rows the scan adds at a time
COMBINE_N = 256  # hidden columns of a combining program
ROW_CHUNK = 2048  # rows a pass takes at most: bounds the fp32 buffer (rows never interact)
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit
def _count(ids, hist, pairs, BINS: tl.constexpr, BLOCK_P: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    expert = tl.load(ids + p, mask=p < pairs, other=0).to(tl.int32)
    tl.store(hist + tl.program_id(0) * BINS + tl.arange(0, BINS), tl.histogram(expert, BINS, mask=p < pairs))


@triton.jit
def _layout(layout, counts, BINS: tl.constexpr, BLOCK_M: tl.constexpr):
    bins = tl.arange(0, BINS)
    tl.store(layout + bins, tl.cumsum(counts, axis=0) - counts)  # an expert's first grouped position
    tl.store(layout + BINS + bins, counts)  # its pairs
    tl.store(layout + 2 * BINS + bins, tl.cumsum((counts + BLOCK_M - 1) // BLOCK_M, axis=0))  # its tiles' end


@triton.jit
def _scan(hist, layout, blocks, BINS: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_M: tl.constexpr,
          PDL: tl.constexpr):
    pdl.wait(PDL)
    bins = tl.arange(0, BINS)
    running = tl.zeros([BINS], dtype=tl.int32)
    for first in range(0, blocks, BLOCK_B):
        rows = first + tl.arange(0, BLOCK_B)
        where = hist + rows[:, None] * BINS + bins[None, :]
        live = rows[:, None] < blocks
        counts = tl.load(where, mask=live, other=0)
        # In place: each block's count becomes the pairs of that expert in the blocks before it.
        tl.store(where, running[None, :] + tl.cumsum(counts, axis=0) - counts, mask=live)
        running += tl.sum(counts, axis=0)
    _layout(layout, running, BINS, BLOCK_M)


@triton.jit
def _route(ids, pair_at, dest_at, p, live, expert, q, top_k, SLOTS: tl.constexpr):
    row, slot = p // top_k, p % top_k
    s = tl.arange(0, SLOTS)
    valid = live[:, None] & (s[None, :] < top_k)
    peers = tl.load(ids + row[:, None] * top_k + s[None, :], mask=valid, other=0).to(tl.int32)
    # The rank of this pair among its row's experts by (id, slot): where its output goes.
    below = valid & ((peers < expert[:, None]) | ((peers == expert[:, None]) & (s[None, :] < slot[:, None])))
    tl.store(pair_at + q, p, mask=live)
    tl.store(dest_at + q, row * top_k + tl.sum(below.to(tl.int32), axis=1), mask=live)


@triton.jit
def _place(ids, hist, layout, pair_at, dest_at, pairs, top_k, BINS: tl.constexpr, BLOCK_P: tl.constexpr,
           SLOTS: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    lanes = tl.arange(0, BLOCK_P)
    p = tl.program_id(0) * BLOCK_P + lanes
    live = p < pairs
    expert = tl.load(ids + p, mask=live, other=0).to(tl.int32)
    # Stable: among a block's pairs of one expert, the lower pair index goes first.
    earlier = (expert[:, None] == expert[None, :]) & (lanes[None, :] < lanes[:, None])
    q = tl.load(layout + expert, mask=live, other=0) + tl.sum(earlier.to(tl.int32), axis=1) \
        + tl.load(hist + tl.program_id(0) * BINS + expert, mask=live, other=0)
    _route(ids, pair_at, dest_at, p, live, expert, q, top_k, SLOTS)


@triton.jit
def _plan_one(ids, layout, pair_at, dest_at, pairs, top_k, BINS: tl.constexpr, BLOCK_P: tl.constexpr,
              SLOTS: tl.constexpr, BLOCK_M: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    _plan_block(ids, layout, pair_at, dest_at, pairs, top_k, BINS, BLOCK_P, SLOTS, BLOCK_M)


@triton.jit
def _route_plan_one(logits, stride_l, ids, weights, rows, experts, layout, pair_at, dest_at, top_k,
                    K: tl.constexpr, NORM: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                    BINS: tl.constexpr, BLOCK_P: tl.constexpr, SLOTS: tl.constexpr, BLOCK_M: tl.constexpr,
                    PDL: tl.constexpr):
    pdl.wait(PDL)
    for row in range(rows):  # each row's choice, as kernels.router makes it
        router.choose(logits + row * stride_l, ids + row * K, weights + row * K, experts, K, NORM, BLOCK_E,
                      BLOCK_K)
    tl.debug_barrier()  # the ids every thread wrote are there for every thread to read
    _plan_block(ids, layout, pair_at, dest_at, rows * top_k, top_k, BINS, BLOCK_P, SLOTS, BLOCK_M)


@triton.jit
def _plan_block(ids, layout, pair_at, dest_at, pairs, top_k, BINS: tl.constexpr, BLOCK_P: tl.constexpr,
                SLOTS: tl.constexpr, BLOCK_M: tl.constexpr):
    # Pairs that fit one block: positions by comparing every pair with every other, one launch in all.
    p = tl.arange(0, BLOCK_P)
    live = p < pairs
    expert = tl.load(ids + p, mask=live, other=0).to(tl.int32)
    before = live[None, :] & ((expert[None, :] < expert[:, None])
                              | ((expert[None, :] == expert[:, None]) & (p[None, :] < p[:, None])))
    _layout(layout, tl.histogram(expert, BINS, mask=live), BINS, BLOCK_M)
    _route(ids, pair_at, dest_at, p, live, expert, tl.sum(before.to(tl.int32), axis=1), top_k, SLOTS)


@triton.jit
def _dot(a, b, acc, PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    if WIDEN:  # the interpreter's bf16 dot is wrong (kernels/__init__.py); fp32 holds the products exactly
        a, b = a.to(tl.float32), b.to(tl.float32)
    return tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)


@triton.jit
def _tile(layout, tile, BINS: tl.constexpr, BLOCK_M: tl.constexpr):
    bins = tl.arange(0, BINS)
    ends = tl.load(layout + 2 * BINS + bins)
    expert = tl.sum((ends <= tile).to(tl.int32), axis=0)  # BINS when the tile is past the last
    safe = tl.minimum(expert, BINS - 1)
    start, count = tl.load(layout + safe), tl.load(layout + BINS + safe)
    end = tl.load(layout + 2 * BINS + safe)
    first = start + (tile - end + (count + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
    stop = tl.where(expert < BINS, start + count, 0)
    return safe, first, stop


@triton.jit
def _gate_up(x, gate_up, h, layout, pair_at, top_k, hidden, inner, stride_x, stride_ge, stride_gn,
             BINS: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    expert, first, stop = _tile(layout, tl.program_id(0), BINS, BLOCK_M)
    if first >= stop:
        return
    q = first + tl.arange(0, BLOCK_M)
    live = q < stop
    token = tl.load(pair_at + q, mask=live, other=0) // top_k
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    gate = gate_up + expert.to(tl.int64) * stride_ge + cols[:, None] * stride_gn
    up = gate + inner * stride_gn
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, hidden, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        wmask = (cols[:, None] < inner) & (ks[None, :] < hidden)
        a = tl.load(x + token[:, None] * stride_x + ks[None, :], mask=live[:, None] & (ks[None, :] < hidden),
                    other=0.0)
        acc_gate = _dot(a, tl.load(gate + ks[None, :], mask=wmask, other=0.0), acc_gate, PRECISION, WIDEN)
        acc_up = _dot(a, tl.load(up + ks[None, :], mask=wmask, other=0.0), acc_up, PRECISION, WIDEN)
    act = acc_gate / (1.0 + tl.exp(-acc_gate)) * acc_up
    tl.store(h + q[:, None] * inner + cols[None, :], act.to(h.dtype.element_ty),
             mask=live[:, None] & (cols[None, :] < inner))


@triton.jit
def _down(h, down, buf, weights, layout, pair_at, dest_at, hidden, inner, stride_de, stride_dn,
          BINS: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr, BLOCK_M: tl.constexpr,
          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    expert, first, stop = _tile(layout, tl.program_id(0), BINS, BLOCK_M)
    if first >= stop:
        return
    q = first + tl.arange(0, BLOCK_M)
    live = q < stop
    weight = tl.load(weights + tl.load(pair_at + q, mask=live, other=0), mask=live, other=0.0).to(tl.float32)
    dest = tl.load(dest_at + q, mask=live, other=0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    w = down + expert.to(tl.int64) * stride_de + cols[:, None] * stride_dn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, inner, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        a = tl.load(h + q[:, None] * inner + ks[None, :], mask=live[:, None] & (ks[None, :] < inner),
                    other=0.0)
        b = tl.load(w + ks[None, :], mask=(cols[:, None] < hidden) & (ks[None, :] < inner), other=0.0)
        acc = _dot(a, b, acc, PRECISION, WIDEN)
    tl.store(buf + dest[:, None].to(tl.int64) * hidden + cols[None, :], acc * weight[:, None],
             mask=live[:, None] & (cols[None, :] < hidden))


@triton.jit
def _combine(buf, out, shared, shared_gate, hidden, top_k, stride_o, stride_s, stride_g,
             SHARED: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    total = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for rank in range(0, top_k):  # ascending expert id, the same order for every row
        total += tl.load(buf + (row * top_k + rank) * hidden + cols, mask=cols < hidden, other=0.0)
    dtype = out.dtype.element_ty
    result = total.to(dtype)
    if SHARED:  # routed + shared * sigmoid(gate), rounded as kernels.sigmoid_gate rounds it
        part = gated(tl.load(shared + row * stride_s + cols, mask=cols < hidden, other=0.0),
                     tl.load(shared_gate + row * stride_g), dtype)
        result = (result.to(tl.float32) + part.to(tl.float32)).to(dtype)
    tl.store(out + row * stride_o + cols, result, mask=cols < hidden)


def _check(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, ids: torch.Tensor,
           weights: torch.Tensor) -> None:
    if x.dim() != 2 or x.dtype not in _DTYPES:
        raise ValueError(f"x must be [rows, hidden] in bf16, fp16 or fp32, not {list(x.shape)} {x.dtype}")
    rows, hidden = x.shape
    if down.dim() != 3 or down.shape[1] != hidden or down.dtype != x.dtype:
        raise ValueError(f"down must be [experts, {hidden}, inner] in {x.dtype}, not {list(down.shape)} "
                         f"{down.dtype}")
    experts, _, inner = down.shape
    if tuple(gate_up.shape) != (experts, 2 * inner, hidden) or gate_up.dtype != x.dtype:
        raise ValueError(f"gate_up must be [{experts}, {2 * inner}, {hidden}] in {x.dtype}, not "
                         f"{list(gate_up.shape)} {gate_up.dtype}")
    if gate_up.stride(2) != 1 or down.stride(2) != 1:
        raise ValueError("gate_up and down must be contiguous along their last axis")
    if ids.dim() != 2 or ids.shape[0] != rows or ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"ids must be [{rows}, top_k] int32 or int64, not {list(ids.shape)} {ids.dtype}")
    if weights.shape != ids.shape or not weights.is_floating_point():
        raise ValueError(f"weights must be {list(ids.shape)} floating point, not {list(weights.shape)} "
                         f"{weights.dtype}")
    for name, tensor in (("gate_up", gate_up), ("down", down), ("ids", ids), ("weights", weights)):
        if tensor.device != x.device:
            raise ValueError(f"{name} is on {tensor.device}, x on {x.device}")


def routed(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, logits: torch.Tensor, top_k: int,
           normalise: bool, shared: torch.Tensor | None = None, shared_gate: torch.Tensor | None = None
           ) -> torch.Tensor:
    """``experts`` for the choice ``kernels.router.top_k(logits, top_k, normalise, x.dtype)`` makes
    from router ``logits`` [rows, experts] (unit column stride): the same bits, and when the rows'
    pairs fit one planning block (decode) the choice and the grouping are one launch."""
    rows = x.shape[0]
    if not 1 <= top_k <= down.shape[0]:
        raise ValueError(f"top_k is {top_k}, expected 1 to {down.shape[0]} (the experts)")
    if logits.dim() != 2 or logits.shape != (rows, down.shape[0]):
        raise ValueError(f"logits is {list(logits.shape)}, expected [{rows}, {down.shape[0]}]: rows, experts")
    if rows == 0 or rows * top_k > PLAN_BLOCK or logits.stride(1) != 1:
        ids, weights = router.top_k(logits, top_k, normalise, x.dtype)
        return experts(x, gate_up, down, ids, weights, shared, shared_gate)
    ids = torch.empty(rows, top_k, dtype=torch.int64, device=x.device)
    weights = torch.empty(rows, top_k, dtype=x.dtype, device=x.device)
    return experts(x, gate_up, down, ids, weights, shared, shared_gate, choice=(logits, normalise))


def experts(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, ids: torch.Tensor,
            weights: torch.Tensor, shared: torch.Tensor | None = None,
            shared_gate: torch.Tensor | None = None, choice: tuple[torch.Tensor, bool] | None = None
            ) -> torch.Tensor:
    """The routed experts' output [rows, hidden] in x's dtype; ``ids`` must lie in [0, experts).
    With ``shared`` [rows, hidden] and ``shared_gate`` [rows, 1] (unit column strides), the MoE
    block's output instead: the routed sum rounded, plus ``shared * sigmoid(shared_gate)``, the bits
    of ``kernels.sigmoid_gate.sigmoid_gate(shared, shared_gate, routed)``, in the same last launch.
    ``choice`` (``routed``'s): the router logits and normalisation that ids and weights are written
    from, in the planning launch (pairs fitting one block only)."""
    _check(x, gate_up, down, ids, weights)
    if (shared is None) != (shared_gate is None):
        raise ValueError("shared and shared_gate come together")
    if shared is not None and shared_gate is not None and (
            shared.shape != x.shape or shared.dtype != x.dtype or shared.stride(1) != 1
            or tuple(shared_gate.shape) != (x.shape[0], 1)):
        raise ValueError(f"shared {list(shared.shape)} {shared.dtype} and shared_gate "
                         f"{list(shared_gate.shape)} must be {list(x.shape)} {x.dtype} (unit column stride) "
                         f"and [{x.shape[0]}, 1]")
    rows, hidden = x.shape
    n_experts, _, inner = down.shape
    top_k = ids.shape[1]
    out = torch.empty(rows, hidden, dtype=x.dtype, device=x.device)
    if rows == 0 or top_k == 0:
        out.zero_()
        return out if shared is None or shared_gate is None else sigmoid_gate(shared, shared_gate, out)
    x, ids, weights = x.contiguous(), ids.contiguous(), weights.contiguous()
    bins = triton.next_power_of_2(n_experts)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"  # tf32 would round fp32 operands
    capacity = min(rows, ROW_CHUNK) * top_k
    h = torch.empty(capacity, inner, dtype=x.dtype, device=x.device)
    buf = torch.empty(capacity, hidden, dtype=torch.float32, device=x.device)
    hist = torch.empty(triton.cdiv(capacity, PLAN_BLOCK), bins, dtype=torch.int32, device=x.device)
    layout = torch.empty(3, bins, dtype=torch.int32, device=x.device)
    pair_at = torch.empty(capacity, dtype=torch.int32, device=x.device)
    dest_at = torch.empty(capacity, dtype=torch.int32, device=x.device)
    for first in range(0, rows, ROW_CHUNK):
        count = min(ROW_CHUNK, rows - first)
        pairs = count * top_k
        chunk_ids, chunk_weights = ids[first:first + count], weights[first:first + count]
        blocks = triton.cdiv(pairs, PLAN_BLOCK)
        slots = triton.next_power_of_2(top_k)
        if choice is not None:  # routed(): the rows' choice, then the plan, one program
            assert blocks == 1 and count == rows
            logits, normalise = choice
            _route_plan_one[(1,)](logits, logits.stride(0), ids, weights, rows, n_experts, layout, pair_at,
                                  dest_at, top_k, K=top_k, NORM=normalise,
                                  BLOCK_E=triton.next_power_of_2(n_experts),
                                  BLOCK_K=triton.next_power_of_2(top_k), BINS=bins, BLOCK_P=PLAN_BLOCK,
                                  SLOTS=slots, BLOCK_M=BLOCK_M, num_warps=router.ROUTE_WARPS,
                                  **pdl.options(x.device))
        elif blocks == 1:
            _plan_one[(1,)](chunk_ids, layout, pair_at, dest_at, pairs, top_k, BINS=bins,
                            BLOCK_P=PLAN_BLOCK, SLOTS=slots, BLOCK_M=BLOCK_M, num_warps=8,
                            **pdl.options(chunk_ids.device))
        else:
            _count[(blocks,)](chunk_ids, hist, pairs, BINS=bins, BLOCK_P=PLAN_BLOCK,
                              **pdl.options(chunk_ids.device))
            _scan[(1,)](hist, layout, blocks, BINS=bins, BLOCK_B=SCAN_BLOCK, BLOCK_M=BLOCK_M,
                        **pdl.options(hist.device))
            _place[(blocks,)](chunk_ids, hist, layout, pair_at, dest_at, pairs, top_k, BINS=bins,
                              BLOCK_P=PLAN_BLOCK, SLOTS=slots, num_warps=8, **pdl.options(chunk_ids.device))
        # Each expert that has pairs takes at least one tile, plus one per full BLOCK_M of them.
        tiles = min(n_experts, pairs) + pairs // BLOCK_M
        _gate_up[(tiles, triton.cdiv(inner, GATE_N))](
            x[first:first + count], gate_up, h, layout, pair_at, top_k, hidden, inner, x.stride(0),
            gate_up.stride(0), gate_up.stride(1), BINS=bins, PRECISION=precision, WIDEN=INTERPRETED,
            BLOCK_M=BLOCK_M, BLOCK_N=GATE_N, BLOCK_K=GATE_K, num_stages=GATE_STAGES, **pdl.options(x.device))
        _down[(tiles, triton.cdiv(hidden, DOWN_N))](
            h, down, buf, chunk_weights, layout, pair_at, dest_at, hidden, inner, down.stride(0),
            down.stride(1), BINS=bins, PRECISION=precision, WIDEN=INTERPRETED, BLOCK_M=BLOCK_M,
            BLOCK_N=DOWN_N, BLOCK_K=DOWN_K, num_stages=DOWN_STAGES, **pdl.options(h.device))
        target = out[first:first + count]
        own = (shared[first:first + count], shared_gate[first:first + count]) if shared is not None and \
            shared_gate is not None else (target, target)  # not read without SHARED
        _combine[(count, triton.cdiv(hidden, COMBINE_N))](
            buf, target, *own, hidden, top_k, target.stride(0), own[0].stride(0), own[1].stride(0),
            SHARED=shared is not None, BLOCK_N=COMBINE_N, **pdl.options(buf.device))
    return out


def reference(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, ids: torch.Tensor,
              weights: torch.Tensor) -> torch.Tensor:
    """The same sum by torch: row by row, its experts in ascending id (then slot), in fp32."""
    _check(x, gate_up, down, ids, weights)
    inner = down.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for row, chosen in enumerate(ids.tolist()):
        for slot in sorted(range(len(chosen)), key=lambda s: (chosen[s], s)):
            both = gate_up[chosen[slot]].float() @ x[row].float()
            gate, up = both[:inner], both[inner:]
            act = (gate / (1.0 + torch.exp(-gate)) * up).to(x.dtype).float()
            out[row] += weights[row, slot].float() * (down[chosen[slot]].float() @ act)
    return out.to(x.dtype)

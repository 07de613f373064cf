"""An MoE layer's experts, grouped by expert: for each row, the sum over its k routed experts in
ascending expert id of ``weight * down_e(h)``, h = silu(gate_e(x)) * up_e(x) computed in fp32 and
cast to the model dtype (as a model-dtype linear hands it on); each weighted term is rounded to the
model dtype as it is stored (as the field's kernels store it), the sum of those is fp32, the result
cast to x's dtype. With the layer's shared expert (``Shared``), the MoE block's output instead: that routed
sum rounded, plus the shared expert's output (the same arithmetic, rounded as a linear's output)
times sigmoid(gate), rounded as ``tfd_kernels.sigmoid_gate`` rounds it.

The shared expert runs in the same launches as expert number ``experts``, one past every routed
id: each row has one pair more, of weight 1, and the tiles of those pairs read the shared expert's
own weight tensors (its inner size may differ from the routed experts'). So it costs no launch of
its own, and its weights are never copied beside the routed ones.

Memory: each selected expert's ``gate_up`` and ``down`` weights are read once per tile of ``BLOCK_M`` pairs
that chose it, so once per call at decode sizes (the shared expert's once per ``BLOCK_M`` rows); an expert no
row chose is never touched. Beside the weights a call writes and reads back ``h`` (pairs x the wider inner
size, model dtype), a buffer of one hidden vector per pair (model dtype), with FP8 weights x's rows and h
quantized (a byte an element, fp32 scales a 128-wide block), and the plan's int32 tables
(``tfd_kernels.moe_plan``), all sized by shapes alone and for at most ``ROW_CHUNK`` rows (more rows take
several passes).

Launches: the plan (``tfd_kernels.moe_plan``: one launch at decode sizes, the router's choice included
when called through ``routed``); ``_gate_up`` (``tfd_kernels.moe_pairs``, as ``_down``) computes h for a
tile of pairs sharing an expert; at one row through ``routed`` there is no plan launch: each ``_gate_up``
program makes the router's choice itself (``tfd_kernels.router.choice``, in the same warps as every other
choice), takes the chosen expert of its tile's rank by id (the shared expert last) and writes what
``_down`` reads;
``_down`` multiplies h by the expert's down weight and the routing weight into the pair's buffer
row, ranked by expert id within its row (the shared pairs' rows after all routed ones);
``tfd_kernels.moe_sum`` sums a row's ranks in order and adds the gated shared expert, or
(``routed_add_zrms``, decode) adds that to the residual stream and normalises it for the next block
as ``tfd_kernels.norm.add_zrms`` does, the same bits one launch sooner; at one row ``_down``'s last
program to finish (an arrival counter) does that in its own launch, in the same warps; with
``ONE_LAUNCH`` both products are one launch (``tfd_kernels.moe_one``), and through ``block_add_zrms``
the router's product too. Every grid is fixed by the shapes (an upper bound on the tiles; a program
past the last tile exits at once), so a call can be captured in a CUDA graph.

FP8: the routed experts' weights and the shared expert's may each be block-wise FP8 (``Fp8Stack``: e4m3
data, a float32 scale per 128x128 block), read at a byte an element; each product is then
``tfd.model.fp8.linear``'s (the input row quantized per 128-wide block, each K block's fp8 dot times
its two scales, summed in order in fp32), all after it the float path's (``tfd_kernels.moe_fp8``), each
tile ``FP8_M`` pairs. The input rows are quantized once, not in every column tile: x by
``tfd_kernels.fp8_gemm.quantize`` before ``_gate_up`` (where gate/up weights are FP8), h by
``moe_fp8.quantize_middles`` between the two launches (where down weights are FP8): a launch each.
Scratch: those quantized rows and scales (strided weight scales are copied contiguous); errors name the
field at fault (``down.scale_inv``).

Batch invariance: a pair's products run over ``hidden`` and its expert's inner size in tiles and an
order fixed by the weight shapes (a dot's row is the same whatever rows share its tile); its rank
depends on its own row alone; the sum over a row's experts is a loop in ascending id, and the
shared expert's output is added after it. Nothing depends on the number of rows or on how many
pairs chose an expert, and nothing is summed by atomics.
"""

from __future__ import annotations

import torch
import triton

from tfd_kernels import (
    fp8_gemm,
    fp8_rows,
    gemm,
    moe_fp8,
    moe_one,
    moe_pairs,
    moe_plan,
    moe_sum,
    norm,
    pdl,
    router,
)
from tfd_kernels.moe_args import Fp8Stack as Fp8Stack  # the launchers' FP8 weights, named here too
from tfd_kernels.moe_args import Residual, Shared, Weights, check, check_residual, operand
from tfd_kernels.runtime import INTERPRETED

BLOCK_M = 16  # pairs in a tile: one tensor-core row block
# Pairs in a tile wherever any expert weights are FP8: a warp group's wgmma rows on every path (decode,
# prompt, one launch), so every FP8 product takes the same fp8 instructions (tfd_kernels.moe_fp8).
FP8_M = 64
# Stage one's columns, reduction step and pipeline depth, then stage two's: the best pair of a 24-pair
# probe on the H200 (35B-A3B experts: 24.9 us at one row against 28.3 for 64x128 / 128x64; at 32
# rows 234.5 against 235.7 us, a 230.7 us weight floor); the same bits for every pair tried.
GATE_N, GATE_K, GATE_STAGES = 32, 128, 4
DOWN_N, DOWN_K, DOWN_STAGES = 64, 128, 3
# The same where any expert weights are FP8 (the K steps stay 128, a scale block: the same bits). An FP8 K
# step moves half a bf16 step's bytes, and a step's time is mostly its wait: on the H100 the 35B-A3B's one-row
# launch took 29.7 us a layer in FP8 against 30.7 in bf16 (2026-12-05). Unswept: bf16's until the device says
# (tfd bench --dtype fp8 --variant s8=tfd_kernels.moe.FP8_GATE_STAGES=8 ..., docs/bench/kit/fp8_moe_sweep.sh).
FP8_GATE_N, FP8_GATE_STAGES = GATE_N, GATE_STAGES
FP8_DOWN_N, FP8_DOWN_STAGES = DOWN_N, DOWN_STAGES
# Rows a pass takes at most: bounds the buffer (rows never interact). 8,192 rows of a prompt in one
# pass read each expert's weights once for all of them: on the H200 8 x 1,024-token prefill took 226 ms
# against 266 in passes of 2,048 (35B-A3B), 183 against 235 (Qwen3-Next-80B-A3B); 0.3 to 0.45 GB more buffer.
ROW_CHUNK = 8192
# A pass whose routed pairs average PROMPT_PAIRS an expert or more (a prompt's) takes tiles of PROMPT_M
# pairs: an expert's weights are read once a tile, and 16-pair tiles read them several times over at m16
# tensor-core rows (8 x 1,024 rows of the 35B-A3B: 266 ms against 325 with 16-pair tiles). Flash Next's
# 1,024 rows take 20 pairs an expert: at 16, one prompt tile an expert (its weights read once), H100
# 33.4 -> 29.3 and 37.3 -> 33.4 ms, two calls (2026-12-06; the 35B-A3B at 600 rows, 18.75 pairs, 46.2 ->
# 45.3). Then its column tiles, K steps, pipeline and warps: 128 x 128 gate|up tiles and 128 x 256 down
# tiles in K steps of 64, four stages (docs/bench/kit/moe_sweep.py, H100, 8,192 rows: the 35B-A3B's two
# launches 1,106 + 887 -> 694 + 579 us, Qwen3-Next-80B-A3B's 1,556 + 1,203 -> 1,132 + 857; 64 x 64 and
# 64 x 128 tiles in K steps of 128 before, two rounds of 20 and 14 variants, every one the same bits).
# The K step changes no bits on the device: the tensor cores add a K step's products 16 at a time into
# the running sum whatever the step (mma or wgmma; the sweep's every variant and tests/kernels/
# test_moe_gpu.py hold a prompt tile's row to decode's 128-wide steps). Interpreted, numpy sums each step
# apart, so there the prompt takes decode's steps (GATE_K, DOWN_K).
PROMPT_PAIRS = 16
PROMPT_M = 128
PROMPT_GATE_N, PROMPT_GATE_K, PROMPT_GATE_STAGES = 128, 64, 4
PROMPT_DOWN_N, PROMPT_DOWN_K, PROMPT_DOWN_STAGES = 256, 64, 4
PROMPT_WARPS = PROMPT_DOWN_WARPS = 8
# An FP8 prompt pass (FP8_M pairs, K steps of a scale block) and a 4-byte one (an fp32 model's, FP32_PROMPT_M
# pairs, decode's K steps): the float prompt's tiles before the sweep. At four bytes an element the sweep's
# four stages need 256 KB (gate|up) and 384 KB (down) of shared memory, past a Hopper SM's 228 KB.
FP8_PROMPT_GATE_N, FP8_PROMPT_GATE_STAGES = 64, 3
FP8_PROMPT_DOWN_N, FP8_PROMPT_DOWN_STAGES = 128, 3
FP32_PROMPT_M = 64
# A prompt pass's programs in groups of PROMPT_GROUP tiles that walk their columns together (0: every tile
# at a column, then the next column): their rows stay in L2 while their experts' weight tiles stream. The
# 35B-A3B's down launch at 8,192 rows re-read its 75 MB of middles once a column block in that order.
# Scheduling alone, the same bits. H100, 8 x 1,024 prefill, best of 3 (2026-12-06): 35B-A3B 0 202.7 ms,
# 32 187.9; Qwen3-Next-80B-A3B 0 133.2, 32 111.2 (2026-12-05: 8 280.3, 32 186.2 against 0 195.6).
PROMPT_GROUP = 32
# One row through ``routed``: the choice in the experts' first launch and the combine in the last
# program of their second; off, the plan's launch and the combining launch (comparisons: same bits).
ONE_ROW = True
# Each weighted term rounded to the model dtype as it is stored, then the fp32 sum of those: the buffer is
# written and read back at the model's bytes (at 8,192 prompt rows of the 35B-A3B, 9 rows a token, 0.6 GB
# each way a layer in fp32). H100, 8 x 1,024 prefill: 119.6 ms against 126.0 (35B-A3B), 71.9 against 76.2
# (80B-A3B). Off: fp32 terms, the arithmetic before (other bits), kept to time the two on the device.
TERMS_ROUNDED = True
# One row through ``routed``: both products in one launch (tfd_kernels.moe_one); off, two (same bits).
ONE_LAUNCH = True
# One row through ``block_add_zrms``: the router's product in that launch too; off, a launch before.
ROUTER_IN_LAUNCH = True


def routed(x: torch.Tensor, gate_up: Weights, down: Weights, logits: torch.Tensor, top_k: int,
           normalise: bool, shared: Shared | None = None) -> torch.Tensor:
    """``experts`` for the choice ``tfd_kernels.router.top_k(logits, top_k, normalise, x.dtype)`` makes
    from router ``logits`` [rows, experts] (unit column stride): the same bits, and when the rows'
    routed pairs are few (decode at a few lanes: ``tfd_kernels.moe_plan.CHOICE_PAIRS``) the choice and
    the grouping are one launch."""
    return _routed(x, gate_up, down, logits, top_k, normalise, shared, None)[0]


def routed_add_zrms(x: torch.Tensor, gate_up: Weights, down: Weights, logits: torch.Tensor,
                    top_k: int, normalise: bool, shared: Shared | None, residual: Residual
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``tfd_kernels.norm.add_zrms(residual.x, routed(...), residual.weight, residual.eps)`` with the
    same bits, the addition and the norm in the experts' last launch (rows up to ``ROW_CHUNK``):
    the residual stream and the next block's input."""
    total, normed = _routed(x, gate_up, down, logits, top_k, normalise, shared, residual)
    assert normed is not None
    return total, normed


def block_add_zrms(x: torch.Tensor, router_weight: torch.Tensor, gate_up: Weights, down: Weights,
                   top_k: int, normalise: bool, shared: tuple[Weights, Weights] | None,
                   residual: Residual, x_rows: tuple[torch.Tensor, torch.Tensor] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``routed_add_zrms`` from the block's input: the router's product ``tfd_kernels.gemm.matmul(x,
    router_weight)`` first (``router_weight`` [experts, hidden], with a shared expert one row more
    for its gate, last), and the shared expert's (gate_up, down); the same bits. At one row the
    router's product runs in the experts' one launch (``tfd_kernels.moe_one``). ``x_rows``: x quantized
    already by the kernel that made it (``tfd_kernels.fp8_rows``), for FP8 gate/up experts."""
    total, normed = _block(x, router_weight, gate_up, down, top_k, normalise, shared, residual, x_rows)
    assert normed is not None
    return total, normed


def block(x: torch.Tensor, router_weight: torch.Tensor, gate_up: Weights, down: Weights, top_k: int,
          normalise: bool, shared: tuple[Weights, Weights] | None) -> torch.Tensor:
    """``block_add_zrms`` without the residual add and norm (Flash Next's blocks, whose hyper-connection
    writes the output back): ``routed`` after the router's product, the same bits; at one row that
    product runs in the experts' one launch."""
    return _block(x, router_weight, gate_up, down, top_k, normalise, shared, None, None)[0]


def _block(x: torch.Tensor, router_weight: torch.Tensor, gate_up: Weights, down: Weights, top_k: int,
           normalise: bool, shared: tuple[Weights, Weights] | None, residual: Residual | None,
           x_rows: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``block_add_zrms``'s and ``block``'s work: the router's product in the one launch where it
    takes it, else ``tfd_kernels.gemm.matmul``'s logits read in place."""
    rows, hidden = x.shape
    experts = down.shape[0]
    if router_weight.shape != (experts + (shared is not None), hidden) or router_weight.dtype != x.dtype:
        raise ValueError(f"router_weight is {list(router_weight.shape)} {router_weight.dtype}, expected "
                         f"[{experts + (shared is not None)}, {hidden}] {x.dtype}")
    if x_rows is not None:
        fp8_rows.check_rows(x_rows, rows, hidden, x.device)
    per_row = top_k + (shared is not None)
    # the launch makes the logits only where _routed gives it the choice (a row's pairs within CHOICE_PAIRS)
    inside = (_one_launch(rows, hidden, per_row, True, residual is not None) and ROUTER_IN_LAUNCH
              and top_k <= moe_plan.CHOICE_PAIRS and router_weight.is_contiguous()
              and moe_one.takes_router(*router_weight.shape))
    logits = torch.empty(rows, router_weight.shape[0], dtype=x.dtype, device=x.device) if inside \
        else gemm.matmul(x, router_weight)
    whole = None if shared is None else Shared(shared[0], shared[1], logits[:, experts:])
    return _routed(x, gate_up, down, logits[:, :experts], top_k, normalise, whole, residual,
                   (router_weight, logits) if inside else None, x_rows)


def _routed(x: torch.Tensor, gate_up: Weights, down: Weights, logits: torch.Tensor, top_k: int,
            normalise: bool, shared: Shared | None, residual: Residual | None,
            product: tuple[torch.Tensor, torch.Tensor] | None = None,
            x_rows: tuple[torch.Tensor, torch.Tensor] | None = None
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``routed``; with ``product`` (the router's weight, the whole logits buffer ``logits`` views: only
    where the one launch takes it, ``_block``'s choice) the launch makes the logits too. ``x_rows``:
    ``_experts``'."""
    rows = x.shape[0]
    if not 1 <= top_k <= down.shape[0]:
        raise ValueError(f"top_k is {top_k}, expected 1 to {down.shape[0]} (the experts)")
    if logits.dim() != 2 or logits.shape != (rows, down.shape[0]):
        raise ValueError(f"logits is {list(logits.shape)}, expected [{rows}, {down.shape[0]}]: rows, experts")
    if rows == 0 or rows * top_k > moe_plan.CHOICE_PAIRS or logits.stride(1) != 1:
        assert product is None  # those logits would be read before the launch made them
        ids, weights = router.top_k(logits, top_k, normalise, x.dtype)
        return _experts(x, gate_up, down, ids, weights, shared, None, residual, x_rows=x_rows)
    ids = torch.empty(rows, top_k, dtype=torch.int64, device=x.device)
    weights = torch.empty(rows, top_k, dtype=x.dtype, device=x.device)
    return _experts(x, gate_up, down, ids, weights, shared, (logits, normalise), residual, product, x_rows)


def _one_launch(rows: int, hidden: int, per_row: int, chosen: bool, norms: bool) -> bool:
    """Whether the block's experts take one launch (``tfd_kernels.moe_one``): one row whose choice they
    make; ``norms``: the launch adds the residual and normalises."""
    return ONE_ROW and ONE_LAUNCH and chosen and rows == 1 and moe_one.fits(hidden, per_row, norms)


def experts(x: torch.Tensor, gate_up: Weights, down: Weights, ids: torch.Tensor,
            weights: torch.Tensor, shared: Shared | None = None,
            choice: tuple[torch.Tensor, bool] | None = None) -> torch.Tensor:
    """The routed experts' output [rows, hidden] in x's dtype for ``x`` [rows, hidden], ``gate_up``
    [experts, 2 * inner, hidden] (gate rows, then up rows), ``down`` [experts, hidden, inner], and
    each row's ``ids`` [rows, top_k] (in [0, experts)) and ``weights``; with ``shared``, the MoE
    block's output (the module docstring says how it is rounded), in the same launches. ``choice``
    (``routed``'s): the router logits and normalisation that ids and weights are written from, in
    the planning launch (at most ``tfd_kernels.moe_plan.CHOICE_PAIRS`` routed pairs). The routed experts'
    weights and the shared expert's are each float (x's dtype) or ``Fp8Stack`` (block-wise FP8). A wrong
    shape, dtype, scale grid or device raises ValueError naming the input (``down.scale_inv``, ...)."""
    return _experts(x, gate_up, down, ids, weights, shared, choice, None)[0]


def _experts(x: torch.Tensor, gate_up: Weights, down: Weights, ids: torch.Tensor,
             weights: torch.Tensor, shared: Shared | None, choice: tuple[torch.Tensor, bool] | None,
             residual: Residual | None, product: tuple[torch.Tensor, torch.Tensor] | None = None,
             x_rows: tuple[torch.Tensor, torch.Tensor] | None = None
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``experts``' output, or with ``residual`` the residual stream plus it and their norm. With
    ``product`` (``_routed``'s, only where the one launch runs), the launch makes the logits too.
    ``x_rows``: x quantized already (``tfd_kernels.fp8_rows.empty_rows``' pair, made by the kernel that
    made x), read by FP8 gate/up tiles instead of quantizing x here."""
    check(x, gate_up, down, ids, weights, shared)
    if residual is not None:
        check_residual(x, residual)
    rows, hidden = x.shape
    n_experts, _, inner = down.shape
    top_k = ids.shape[1]
    out = torch.empty(rows, hidden, dtype=x.dtype, device=x.device)
    if rows == 0:
        return (out, None) if residual is None else (out, torch.empty_like(out))
    x, ids, weights = x.contiguous(), ids.contiguous(), weights.contiguous()
    routed_gate_up, routed_down = operand(gate_up), operand(down)
    # Without a shared expert no tile is its, so a routed expert's weights stand in, never read.
    own_gate_up, own_down = ((routed_gate_up.first(), routed_down.first()) if shared is None else
                             (operand(shared.gate_up), operand(shared.down)))
    fp8 = any(weight.fp8 for weight in (routed_gate_up, routed_down, own_gate_up, own_down))
    shared_inner = own_down.data.shape[1]
    width = max(inner, shared_inner)  # h's row: room for either expert's middle
    per_row = top_k + (shared is not None)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"  # tf32 would round fp32 operands
    chunk = min(rows, ROW_CHUNK)
    h = torch.empty(chunk * per_row, width, dtype=x.dtype, device=x.device)
    buf = torch.empty(chunk * per_row, hidden, dtype=x.dtype if TERMS_ROUNDED else torch.float32,
                      device=x.device)
    # FP8 down tiles read the middles quantized once, between the launches (stand-ins where float: unread)
    quantize_h = routed_down.fp8 or own_down.fp8
    hq, h_scales = (h, h) if not quantize_h else (
        torch.empty(h.shape, dtype=torch.float8_e4m3fn, device=x.device),
        torch.empty(h.shape[0], triton.cdiv(width, moe_fp8.STEP.value), dtype=torch.float32, device=x.device))
    bins = triton.next_power_of_2(n_experts + (shared is not None))  # a bin for the shared expert's id too
    tables = moe_plan.Tables.empty(chunk * top_k, bins, x.device)
    one_row = ONE_ROW and choice is not None and rows == 1  # the choice in the experts' first launch
    tile_expert = torch.empty(per_row, dtype=torch.int32, device=x.device) if one_row else tables.pair_at
    one_launch = _one_launch(rows, hidden, per_row, choice is not None, residual is not None)
    assert product is None or one_launch
    if one_launch and choice is not None:
        gate = out if shared is None else shared.gate
        normed = torch.empty_like(out) if residual is not None else None
        moe_one.launch(x, routed_gate_up, own_gate_up, h, routed_down, own_down, buf, choice[0], choice[1],
                       ids, weights, tables, tile_expert, gate, shared is not None, out,
                       None if residual is None or normed is None else
                       (residual.x.contiguous(), residual.weight, residual.eps, normed),
                       {"block_m": FP8_M, "gate_n": FP8_GATE_N, "gate_k": GATE_K, "down_n": FP8_DOWN_N,
                        "down_k": DOWN_K, "stages": FP8_GATE_STAGES} if fp8 else
                       {"block_m": BLOCK_M, "gate_n": GATE_N, "gate_k": GATE_K, "down_n": DOWN_N,
                        "down_k": DOWN_K, "stages": GATE_STAGES},
                       None if product is None else product[0], x_rows)
        return out, normed
    prompt = chunk * top_k >= PROMPT_PAIRS * n_experts
    four_bytes = x.element_size() == 4
    block_m = FP8_M if fp8 else (FP32_PROMPT_M if four_bytes else PROMPT_M) if prompt else BLOCK_M
    if prompt:
        gate_n, gate_stages, down_n, down_stages = (
            (FP8_PROMPT_GATE_N, FP8_PROMPT_GATE_STAGES, FP8_PROMPT_DOWN_N, FP8_PROMPT_DOWN_STAGES)
            if fp8 or four_bytes else (PROMPT_GATE_N, PROMPT_GATE_STAGES, PROMPT_DOWN_N, PROMPT_DOWN_STAGES))
    else:
        gate_n, gate_stages, down_n, down_stages = (
            (FP8_GATE_N, FP8_GATE_STAGES, FP8_DOWN_N, FP8_DOWN_STAGES) if fp8
            else (GATE_N, GATE_STAGES, DOWN_N, DOWN_STAGES))
    group = PROMPT_GROUP if prompt else 0
    # a float prompt's K steps: any on the tensor cores gives decode's bits, numpy's only decode's own
    wide = prompt and not fp8 and not four_bytes and not INTERPRETED
    gate_k, down_k = (PROMPT_GATE_K, PROMPT_DOWN_K) if wide else (GATE_K, DOWN_K)
    for first in range(0, rows, ROW_CHUNK):
        count = min(ROW_CHUNK, rows - first)
        pairs = count * top_k
        chunk_ids, chunk_weights = ids[first:first + count], weights[first:first + count]
        if one_row:
            tiles = per_row
        else:
            made = None if choice is None else (choice[0][first:first + count], chunk_weights, choice[1])
            moe_plan.plan(tables, chunk_ids, n_experts, shared is not None, block_m, made)
            # Each routed expert that has pairs takes at least one tile, plus one per full block_m of
            # them; the shared expert's group takes a tile per block_m rows.
            tiles = min(n_experts, pairs) + pairs // block_m
            tiles += 0 if shared is None else triton.cdiv(count, block_m)
        logits, normalise = choice if one_row and choice is not None else (x, False)  # read at one row only
        rows_x = x[first:first + count]
        xq, x_scales = x, x  # stand-ins where float: never read
        if routed_gate_up.fp8 or own_gate_up.fp8:  # quantized once: by the kernel that made them, or here
            xq, x_scales = fp8_gemm.quantize(rows_x) if x_rows is None else \
                (x_rows[0][first:first + count], x_rows[1][first:first + count])
        moe_pairs._gate_up[moe_pairs.grid(tiles, triton.cdiv(width, gate_n), group)](
            rows_x, xq, x_scales, *routed_gate_up[:2], *own_gate_up[:2], h, tables.layout, tables.pair_at,
            pairs, top_k, n_experts, hidden, inner, shared_inner, width, x.stride(0),
            *routed_gate_up.data.stride()[:2], own_gate_up.data.stride(0), logits, chunk_ids, chunk_weights,
            tables.dest_at, tile_expert, tiles, count, BINS=bins, PRECISION=precision, WIDEN=INTERPRETED,
            BLOCK_M=block_m, BLOCK_N=gate_n, BLOCK_K=gate_k, ONE_ROW=one_row, K=top_k, NORM=normalise,
            BLOCK_E=triton.next_power_of_2(n_experts), SLOTS=triton.next_power_of_2(top_k),
            FP8=routed_gate_up.fp8, SHARED_FP8=own_gate_up.fp8, GROUP=group,
            num_warps=PROMPT_WARPS if prompt else router.ROUTE_WARPS, num_stages=gate_stages,
            **pdl.options(x.device))
        target = out[first:first + count]
        gate = target if shared is None else shared.gate[first:first + count]  # not read without SHARED
        block = triton.next_power_of_2(hidden)
        finish = one_row and residual is not None  # the sum, the residual add and the norm in _down
        normed = torch.empty_like(out) if residual is not None else out
        held = residual if residual is not None else Residual(out, out[0], 0.0)  # not read unless finishing
        if quantize_h:  # routed pairs' middles (inner wide), then the shared pairs' (shared_inner)
            moe_fp8.quantize_middles(h, hq, h_scales, count * per_row, pairs, inner, shared_inner)
        moe_pairs._down[moe_pairs.grid(tiles, triton.cdiv(hidden, down_n), group)](
            h, hq, h_scales, *routed_down[:2], *own_down[:2], buf, chunk_weights, tables.layout,
            tables.pair_at, tables.dest_at, pairs, n_experts, hidden, inner, shared_inner, width,
            *routed_down.data.stride()[:2], own_down.data.stride(0), tile_expert, gate, held.x.contiguous(),
            out, normed, held.weight, gate.stride(0), held.eps, moe_pairs.arrivals(x.device), tiles,
            BINS=bins, PRECISION=precision, WIDEN=INTERPRETED, BLOCK_M=block_m, BLOCK_N=down_n,
            BLOCK_K=down_k, ONE_ROW=one_row, FINISH=finish, TOP_K=top_k, SHARED=shared is not None,
            HIDDEN_BLOCK=block, FP8=routed_down.fp8, SHARED_FP8=own_down.fp8, GROUP=group,
            num_warps=norm.warps(block) if finish else PROMPT_DOWN_WARPS if prompt else 4,
            num_stages=down_stages, **pdl.options(x.device))
        if finish:
            return out, normed
        if residual is not None and rows <= ROW_CHUNK:  # the sum, the residual add and the norm at once
            moe_sum.combine_add_zrms(buf, gate, residual.x.contiguous(), out, normed, residual.weight, pairs,
                                     top_k, shared is not None, residual.eps)
            return out, normed
        moe_sum.combine(buf, target, gate, pairs, top_k, shared is not None)
    if residual is not None:
        return norm.add_zrms(residual.x, out, residual.weight, residual.eps)
    return out, None


def _expert(gate_up: torch.Tensor, down: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """One expert on one row ``x``, in fp32, its middle rounded to x's dtype as the kernel rounds it."""
    inner = down.shape[1]
    both = gate_up.float() @ x.float()
    gate, up = both[:inner], both[inner:]
    return down.float() @ (gate / (1.0 + torch.exp(-gate)) * up).to(x.dtype).float()


def reference(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, ids: torch.Tensor,
              weights: torch.Tensor, shared: Shared | None = None) -> torch.Tensor:
    """The same by torch: row by row, its experts in ascending id (then slot), each weighted term
    rounded to x's dtype, summed in fp32 and rounded; with ``shared``, its output rounded, gated and
    added, each step rounded as the kernel's.
    Float weights only (FP8 products are ``tfd.model.fp8.linear``'s: tests/kernels/test_moe_fp8.py)."""
    check(x, gate_up, down, ids, weights, shared)
    total = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for row, chosen in enumerate(ids.tolist()):
        for slot in sorted(range(len(chosen)), key=lambda s: (chosen[s], s)):
            expert = chosen[slot]
            term = weights[row, slot].float() * _expert(gate_up[expert], down[expert], x[row])
            total[row] += term.to(x.dtype).float() if TERMS_ROUNDED else term
    out = total.to(x.dtype)
    if shared is None:
        return out
    own_gate_up, own_down = shared.gate_up, shared.down
    if not isinstance(own_gate_up, torch.Tensor) or not isinstance(own_down, torch.Tensor):
        raise ValueError("shared must hold float weights: reference makes no FP8 products")
    value = torch.zeros_like(out)
    for row in range(x.shape[0]):
        value[row] = _expert(own_gate_up, own_down, x[row]).to(x.dtype)
    sig = (1.0 / (1.0 + torch.exp(-shared.gate.float()))).to(x.dtype).float()
    return (out.float() + (value.float() * sig).to(x.dtype).float()).to(x.dtype)

"""An MoE router's choice from its logits in one launch: softmax in fp32, the top k experts (the
lower id first among equal probabilities), their probabilities renormalised to sum to one when
asked, as the model dtype. One program a row reads the row's ``experts`` logits once and writes k
ids and k weights; a row's choice never depends on the others. ``reference`` is the torch form,
which the CPU path runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import pdl

# Warps of a choice: the softmax's sums follow the thread layout, so every kernel that makes a choice
# runs this many: the router kernel, the plan's launch that chooses first (kernels.moe_plan) and the
# grouped experts' first launch at one row (kernels.moe), whose programs each choose for themselves.
ROUTE_WARPS = 4


@triton.jit
def _top_k(logits, chosen, weights, experts, stride, K: tl.constexpr, NORM: tl.constexpr,
           BLOCK: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    row = tl.program_id(0)
    choose(logits + row * stride, chosen + row * K, weights + row * K, experts, K, NORM, BLOCK, BLOCK_K)


@triton.jit
def choice(logits, experts, K: tl.constexpr, NORM: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
           CACHE: tl.constexpr):
    """One row's choice from its ``experts`` logits at ``logits``: ([BLOCK_K] ids, [BLOCK_K] fp32
    weights), slots from K on zero. ``CACHE``: the logits' load modifier (".cg" where other programs
    of the same launch stored them)."""
    ids = tl.arange(0, BLOCK)
    live = ids < experts
    x = tl.load(logits + ids, mask=live, other=float("-inf"), cache_modifier=CACHE).to(tl.float32)
    scaled = tl.exp(x - tl.max(x, axis=0))
    left = tl.where(live, scaled / tl.sum(scaled, axis=0), -1.0)  # probabilities; -1 is never picked
    slots = tl.arange(0, BLOCK_K)
    picked = tl.zeros([BLOCK_K], tl.float32)
    best = tl.zeros([BLOCK_K], tl.int64)
    for slot in tl.static_range(K):
        # the largest left and, of equal maxima, the first: the lower expert id (one reduction)
        value, at = tl.max(left, axis=0, return_indices=True, return_indices_tie_break_left=True)
        picked = tl.where(slots == slot, value, picked)
        best = tl.where(slots == slot, at.to(tl.int64), best)
        left = tl.where(ids == at, -1.0, left)
    if NORM:
        picked = picked / tl.sum(picked, axis=0)
    return best, picked


@triton.jit
def choose(logits, chosen, weights, experts, K: tl.constexpr, NORM: tl.constexpr, BLOCK: tl.constexpr,
           BLOCK_K: tl.constexpr):
    """``choice`` written out: K ids at ``chosen``, K weights (their dtype) at ``weights``."""
    best, picked = choice(logits, experts, K, NORM, BLOCK, BLOCK_K, "")
    slots = tl.arange(0, BLOCK_K)
    tl.store(chosen + slots, best, mask=slots < K)
    tl.store(weights + slots, picked.to(weights.dtype.element_ty), mask=slots < K)


def top_k(logits: torch.Tensor, k: int, normalise: bool, dtype: torch.dtype
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(experts int64, weights in ``dtype``), each [rows, k], from router ``logits`` [rows, experts]
    (unit column stride, any float dtype)."""
    if logits.dim() != 2 or logits.stride(1) != 1 or not logits.dtype.is_floating_point:
        raise ValueError(f"logits must be float [rows, experts] with unit column stride, got "
                         f"{logits.dtype} {list(logits.shape)}")
    rows, experts = logits.shape
    if not 1 <= k <= experts:
        raise ValueError(f"k is {k}, expected 1 to {experts} (the experts)")
    chosen = torch.empty(rows, k, dtype=torch.int64, device=logits.device)
    weights = torch.empty(rows, k, dtype=dtype, device=logits.device)
    if rows:
        _top_k[(rows,)](logits, chosen, weights, experts, logits.stride(0), K=k, NORM=normalise,
                        BLOCK=triton.next_power_of_2(experts), BLOCK_K=triton.next_power_of_2(k),
                        num_warps=ROUTE_WARPS, **pdl.options(logits.device))
    return chosen, weights


def reference(logits: torch.Tensor, k: int, normalise: bool, dtype: torch.dtype
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``top_k`` in torch: a stable sort, so among equal probabilities the lower expert wins."""
    probs = torch.softmax(logits.float(), dim=-1)
    order = torch.sort(probs, dim=-1, descending=True, stable=True)
    chosen, weights = order.indices[:, :k], order.values[:, :k]
    if normalise:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return chosen, weights.to(dtype)

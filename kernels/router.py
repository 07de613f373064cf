"""An MoE router's choice from its logits in one launch: softmax in fp32, the top k experts (the
lower id first among equal probabilities), their probabilities renormalised to sum to one when
asked, as the model dtype. One program a row reads the row's ``experts`` logits once and writes k
ids and k weights; a row's choice never depends on the others. ``reference`` is the torch form,
which the CPU path runs.

``choice`` is made in one of two forms (``TWO_LEVEL``) that pick the same experts from the same
probabilities: a bitonic top-k over keys that pack each probability with its id, which sorts within
each warp first and crosses warps only to merge their parts (``choice_merged``), or K rounds of an
argmax over the whole row, each a reduction across every warp (``choice_rounds``, the form before).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfd_kernels import pdl

# Warps of a choice: the softmax's sums follow the thread layout, so every kernel that makes a choice
# runs this many: the router kernel, the plan's launch that chooses first (tfd_kernels.moe_plan) and the
# grouped experts' first launch at one row (tfd_kernels.moe), whose programs each choose for themselves.
ROUTE_WARPS = 4
# The form of ``choice``: True, the top k within each warp's part of the row first and then across
# the warps (``choice_merged``); False, K rounds over the whole row (``choice_rounds``). The same
# experts and probabilities either way; renormalised, the k weights' sum adds in another order on the
# GPU (an ulp apart, so a 35B-A3B run's tokens differ between the forms: every path takes this one).
# 35B-A3B one stream: 2.567 against 2.622 ms. Read when a kernel compiles (Triton refuses a change
# after that), so an A/B comparison sets it in each process before the first launch.
TWO_LEVEL = tl.constexpr(True)


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
    of the same launch stored them). ``TWO_LEVEL`` picks the form; both choose alike."""
    return choice_of(row_logits(logits, experts, BLOCK, CACHE), experts, K, NORM, BLOCK, BLOCK_K)


@triton.jit
def row_logits(logits, experts, BLOCK: tl.constexpr, CACHE: tl.constexpr):
    """The row's logits at ``logits`` as fp32 [BLOCK], -inf past the experts: what ``choice_of`` takes."""
    ids = tl.arange(0, BLOCK)
    return tl.load(logits + ids, mask=ids < experts, other=float("-inf"), cache_modifier=CACHE).to(tl.float32)


@triton.jit
def choice_of(x, experts, K: tl.constexpr, NORM: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr):
    """``choice`` from the row's logits ``x`` (``row_logits``' form), wherever they came from."""
    if TWO_LEVEL:
        best, picked = choice_merged(x, experts, K, NORM, BLOCK, BLOCK_K)
    else:
        best, picked = choice_rounds(x, experts, K, NORM, BLOCK, BLOCK_K)
    return best, picked


@triton.jit
def _probabilities(x, experts, BLOCK: tl.constexpr):
    """The row's ids, which of them are experts, and the softmax's fp32 probabilities: one code for
    both forms, so that both compute the same bits (its sums follow the thread layout)."""
    ids = tl.arange(0, BLOCK)
    scaled = tl.exp(x - tl.max(x, axis=0))
    return ids, ids < experts, scaled / tl.sum(scaled, axis=0)


@triton.jit
def choice_merged(x, experts, K: tl.constexpr, NORM: tl.constexpr, BLOCK: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    """``choice`` as one top-k (``top_keys``) over keys that are unique and ordered as the choice
    orders experts: the top k within each warp's part of the row (registers, shuffles), then the
    warps' parts merged in log2(ROUTE_WARPS) steps across warps, where the rounds take one a slot."""
    ids, live, p = _probabilities(x, experts, BLOCK)
    # The probability's bits (non-negative, so ordered as the values) above BLOCK - 1 - id: the larger
    # key is the larger probability and, of equal ones, the lower id; -1, below every expert, elsewhere.
    key = tl.where(live, (p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (BLOCK - 1 - ids), -1)
    won = top_keys(key, BLOCK, BLOCK_K)  # the BLOCK_K largest keys, largest first (the first K experts')
    slots = tl.arange(0, BLOCK_K)
    best = tl.where(slots < K, BLOCK - 1 - won.to(tl.int32), 0).to(tl.int64)  # to int32: the low half
    picked = tl.where(slots < K, (won >> 32).to(tl.int32).to(tl.float32, bitcast=True), 0.0)
    if NORM:
        picked = picked / tl.sum(picked, axis=0)
    return best, picked


@triton.constexpr_function
def _log2(n):
    """log2 of a power of two, when a kernel compiles."""
    return n.bit_length() - 1


@triton.constexpr_function
def _axis_shape(n, b):
    """The shape that broadcasts bit ``b`` of the index against a [2] * n hypercube (axis n - 1 - b)."""
    return [1] * (n - 1 - b) + [2] + [1] * b


@triton.jit
def _order(h, n: tl.constexpr, t: tl.constexpr, s: tl.constexpr):
    """Each pair of keys in the [2] * n hypercube ``h`` whose indices differ in bit ``t`` put in order:
    descending where bit ``s`` of the index is 0 (everywhere when s >= n), else ascending. A key's
    partner is the pair's sum less the key (exact, as int64 sums wrap): a sum over one axis, one
    shuffle or register move on the GPU as any exchange, and a numpy sum in the interpreter (where
    tl.topk's xor reduction runs a key at a time, many times slower)."""
    other = tl.sum(h, axis=n - 1 - t, keep_dims=True) - h
    second = tl.reshape(tl.arange(0, 2), _axis_shape(n, t))  # 1 at the pair's second key
    up = tl.reshape(tl.arange(0, 2), _axis_shape(n, s)) if s < n else 0
    return tl.where((h > other) == (second == up), h, other)  # the larger where it is wanted


@triton.jit
def top_keys(key, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr):
    """The BLOCK_K largest of the [BLOCK] keys ``key`` (distinct, but for equal ones whose order does
    not matter), largest first; both sizes powers of two. A bitonic top-k: runs of BLOCK_K are
    sorted, alternately descending and ascending; then each pair of neighbouring runs is halved to
    their elementwise maxima (a bitonic run that holds the pair's top BLOCK_K) and sorted again,
    until one run is left. The index's high bits go last: on the GPU they are the warps', so only
    their log2(warps) halvings cross warps."""
    N: tl.constexpr = _log2(BLOCK)
    KB: tl.constexpr = _log2(BLOCK_K)
    if KB == 0:
        won = tl.max(key, axis=0, keep_dims=True)  # the largest alone: no runs to sort
    else:
        h = tl.reshape(key, [2] * N)
        for s in tl.static_range(1, KB + 1):  # runs of 2**s, alternating by bit s
            for u in tl.static_range(s):
                h = _order(h, N, s - 1 - u, s)
        for level in tl.static_range(1, N - KB + 1):  # N - level bits are left after this halving
            h = tl.max(h, axis=N - level - KB)  # bit KB: each run against its neighbour
            for u in tl.static_range(KB):
                h = _order(h, N - level, KB - 1 - u, KB)
        won = tl.reshape(h, [BLOCK_K])
    return won


@triton.jit
def choice_rounds(x, experts, K: tl.constexpr, NORM: tl.constexpr, BLOCK: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    """``choice`` in K rounds over the whole row, each one reduction across every warp (the form
    before ``choice_merged``, kept for comparisons)."""
    ids, live, p = _probabilities(x, experts, BLOCK)
    left = tl.where(live, p, -1.0)  # probabilities; -1 is never picked
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

"""Asking L2 for bytes that a later launch of the same step will read, from a launch that leaves the
memory bus idle.

At one decode row most launches wait on latency, not bandwidth: the grouped experts' first launch
moved 37.7 MB in 15.6 us on the H200, about 58% of the bus, while the next launch's 18.9 MB of
weights sat in DRAM. ``lines`` spreads such a range over a launch's programs, each asking for its
share with ``prefetch.global.L2`` (no registers held, nothing waited on), so the later launch finds
it in L2 (50 MB on the H200). Values never change: only where bytes are read from.

``enabled(device)`` is the constexpr a kernel takes: off in Triton's interpreter (no PTX there),
off the CUDA device, and off when ``ENABLED`` is cleared (A/B timing: the same bits either way).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import INTERPRETED

ENABLED = True
# Rows (lanes) up to which a launch asks L2 for the next product's weights: past a few, that launch
# streams enough bytes of its own (states, keys) to evict them before they are read.
AHEAD_ROWS = 4
_ASK = tl.constexpr("{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }")


def enabled(device: torch.device) -> bool:
    """Whether kernels on ``device`` ask L2 ahead."""
    return ENABLED and not INTERPRETED and device.type == "cuda" and torch.version.hip is None


def ahead(weight: torch.Tensor | None, rows: int) -> tuple[torch.Tensor | None, int, bool]:
    """A launch's arguments for asking L2 for ``weight`` (the next product's, contiguous) at ``rows``
    rows: the tensor, its bytes, and the kernel's constexpr; off (None, 0, False) past
    ``AHEAD_ROWS`` rows or where ``enabled`` is not."""
    if weight is None or rows > AHEAD_ROWS or not enabled(weight.device):
        return None, 0, False
    return weight, weight.numel() * weight.element_size(), True


@triton.jit
def lines(base, nbytes, part, parts, BLOCK: tl.constexpr):
    """Part ``part`` of ``parts`` asks L2 for its share of the ``nbytes`` bytes from ``base`` (any
    pointer), whole 128-byte lines, ``BLOCK`` lines a round."""
    count = tl.cdiv(nbytes, 128)
    share = tl.cdiv(count, parts)
    first = part * share
    last = tl.minimum(first + share, count)
    start = base.to(tl.pointer_type(tl.int8))
    for line in range(first, last, BLOCK):
        at = line + tl.arange(0, BLOCK)
        # a dummy output, as inline asm must have one; not pure, so the request is never dropped
        tl.inline_asm_elementwise(_ASK, "=r,l,r", [start + at.to(tl.int64) * 128, (at < last).to(tl.int32)],
                                  dtype=tl.int32, is_pure=False, pack=1)

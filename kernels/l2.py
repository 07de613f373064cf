"""L2 residency hints: ask L2 for a weight's lines ahead of the product that reads them.

A decode step's MoE launch leaves HBM nearly idle while its router's product and choice run (a few
microseconds before the chosen experts' weights stream); programs waiting there can ask L2 for the
next layer's first weight, so that product starts with part of it on chip. ``prefetch`` issues
``prefetch.global.L2::evict_last`` (sm_80 and up) for a range of 128-byte lines: no register holds
the data, nothing waits for it, and no value anywhere changes, so a hint never changes a bit. The
interpreter has no inline assembly: callers compile it out there.
"""

from __future__ import annotations

import triton
import triton.language as tl

LINE_BYTES = 128  # an L2 line


@triton.jit
def prefetch(base, first, lines, LINES: tl.constexpr, PER_LINE: tl.constexpr):
    """Lines ``first`` .. ``first + LINES`` of the tensor at ``base`` (``PER_LINE`` elements a line),
    clamped to its ``lines`` lines, asked of L2 to be kept (evict_last)."""
    line = tl.minimum(first + tl.arange(0, LINES), lines - 1)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l",
                              [base + line.to(tl.int64) * PER_LINE], dtype=tl.int32, is_pure=False, pack=1)

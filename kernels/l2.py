"""L2 residency hints: ask L2 for a weight's lines ahead of the product that reads them.

A decode step's MoE launch leaves HBM nearly idle while its router's product and choice run (a few
microseconds before the chosen experts' weights stream); programs waiting there can ask L2 for the
next layer's first weight, so that product starts with part of it on chip. ``prefetch`` issues
``prefetch.global.L2::evict_last`` (sm_80 and up) for a range of 128-byte lines: no register holds
the data, nothing waits for it, and no value anywhere changes, so a hint never changes a bit. The
interpreter has no inline assembly: ``shares`` gives no hints there, and a kernel compiles them out
when its share is 0.
"""

from __future__ import annotations

import attrs
import torch
import triton
import triton.language as tl

from kernels import INTERPRETED

LINE_BYTES = 128  # an L2 line


@attrs.frozen
class Hints:
    """What a launch passes for its programs' hints: the tensor asked for (a stand-in, never read,
    without hints), its lines, each program's share of lines (0: no hints) and elements a line."""

    tensor: torch.Tensor
    lines: int
    per_program: int
    per_line: int


def shares(weight: torch.Tensor | None, megabytes: int, programs: int, stand_in: torch.Tensor) -> Hints:
    """The first ``megabytes`` of ``weight`` (contiguous) split among ``programs`` programs, a share a
    power of two lines; no hints without a weight or megabytes, in the interpreter or off CUDA
    (``stand_in`` is passed in the weight's place then)."""
    if weight is None or not megabytes or INTERPRETED or not weight.is_cuda:
        return Hints(stand_in, 1, 0, LINE_BYTES // stand_in.element_size())
    lines = max(1, weight.numel() * weight.element_size() // LINE_BYTES)
    asked = min(lines, (megabytes << 20) // LINE_BYTES)
    return Hints(weight, lines, triton.next_power_of_2(triton.cdiv(asked, programs)),
                 LINE_BYTES // weight.element_size())


@triton.jit
def prefetch(base, first, lines, LINES: tl.constexpr, PER_LINE: tl.constexpr):
    """Lines ``first`` .. ``first + LINES`` of the tensor at ``base`` (``PER_LINE`` elements a line),
    clamped to its ``lines`` lines, asked of L2 to be kept (evict_last)."""
    line = tl.minimum(first + tl.arange(0, LINES), lines - 1)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l",
                              [base + line.to(tl.int64) * PER_LINE], dtype=tl.int32, is_pure=False, pack=1)

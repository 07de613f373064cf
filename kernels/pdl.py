"""Programmatic dependent launch: on Hopper a kernel's programs may start while the kernel before it
on the stream finishes, so a decode step's ~500 launches do not each wait out a launch gap.

A kernel launched with ``**options(device)`` must call ``wait(PDL)`` before it touches memory that
another kernel reads or writes: ``wait`` returns once the kernel before has finished and its writes
show, then lets the next kernel's programs start (they wait the same way). tfd's kernels wait first
thing. (Asking L2 for a product's first weight tiles before ``wait`` measured slower on the H200.)
Kernels launched without it, torch's included, are ordered as usual, so the two mix freely on a
stream and in a CUDA graph. Off in the interpreter, on CPUs, on ROCm and below compute capability 9;
``ENABLED`` turns it off for comparisons (same bits either way: only timing changes).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from tfd_kernels.runtime import INTERPRETED

ENABLED = True


@functools.cache
def _supported(device: torch.device) -> bool:
    return (not INTERPRETED and device.type == "cuda" and torch.version.hip is None  # NVIDIA's griddepcontrol
            and torch.cuda.get_device_capability(device)[0] >= 9)


def options(device: torch.device) -> dict[str, bool]:
    """Launch keywords: the ``PDL`` constexpr every tfd kernel takes and Triton's ``launch_pdl``."""
    on = ENABLED and _supported(device)
    return {"PDL": on, "launch_pdl": on}


@triton.jit
def wait(PDL: tl.constexpr):
    """With PDL, wait for the kernel before this one (its writes visible), then let the next start."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()

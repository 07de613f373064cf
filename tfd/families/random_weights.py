"""Weights drawn at random in the shapes a config asks for: for benchmarks of shapes no checkpoint
can be fetched for (``--random-weights``), and for the embedded demo models.

Each tensor has its own generator, seeded from the seed and the tensor's name, so a tensor comes
out the same whatever else is drawn and in whatever order. Values follow transformers' init:
normal(0, 0.02) matrices, zero-centred norms at 0, plain norms at 1, GDN decay rates from
log(uniform(1, 16)), dt_bias at 1.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping

import torch

from tfd.families.naming import Shape
from tfd.model.fp8 import quantize_experts, quantize_weight
from tfd.quantization import released_fp8, scales_of

STD = 0.02


def random_tensors(shapes: Mapping[str, Shape], seed: int, dtype: torch.dtype = torch.float32,
                   device: torch.device | str = "cpu", fp8: bool = False) -> dict[str, torch.Tensor]:
    """Every tensor of ``shapes`` in ``dtype``; ``fp8``: those Qwen's -FP8 releases store in FP8
    (``tfd.quantization.released_fp8``) drawn in fp32, then quantized block-wise beside their
    ``_scale_inv``, one at a time (no more than one fp32 tensor held at once)."""
    tensors = {}
    for name, shape in shapes.items():
        drawn = random_tensor(name, shape, seed, device)
        if fp8 and released_fp8(name, shape):
            weight = quantize_weight(drawn) if len(shape) == 2 else quantize_experts(drawn)
            tensors[name], tensors[scales_of(name)] = weight.data, weight.scale_inv
        else:
            tensors[name] = drawn.to(dtype=dtype)
        del drawn
    return tensors


def random_tensor(name: str, shape: Shape, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """One tensor, drawn on ``device`` by a generator there (a GPU's draws differ from the CPU's)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    generator = torch.Generator(device).manual_seed(int.from_bytes(digest[:8], "little"))
    if name.endswith("A_log"):
        return torch.empty(shape, device=device).uniform_(1.0, 16.0, generator=generator).log_()
    if name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
        return torch.ones(shape, device=device)
    if len(shape) == 1:
        return torch.zeros(shape, device=device)  # zero-centred norms: the identity scale
    if name.endswith("conv1d.weight"):
        return torch.randn(shape, generator=generator, device=device) / math.sqrt(shape[-1])
    return torch.randn(shape, generator=generator, device=device) * STD

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

STD = 0.02


def random_tensors(shapes: Mapping[str, Shape], seed: int, dtype: torch.dtype = torch.float32,
                   device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    return {name: random_tensor(name, shape, seed, device).to(dtype=dtype) for name, shape in shapes.items()}


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

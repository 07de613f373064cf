"""Qwen3-Next (``qwen3_next``): Qwen3.5's stack with the GDN projections grouped by key head.

Its ``in_proj_qkvz`` holds, for each key head g, rows q_g, k_g, the r value heads' v, then their z
(r = value heads / key heads), and ``in_proj_ba`` holds b_g then a_g; loading regroups them into
Qwen3.5's [all q | all k | all v] layout, so value head g * r + i keeps its place
(reference/model.md 2.4). Everything downstream is Qwen3.5's.
"""

from __future__ import annotations

import torch

from tfd.families import qwen3_5
from tfd.families.config import LINEAR, HybridConfig
from tfd.families.naming import Expect, Get, Naming, Shape
from tfd.model.fp8 import Fp8Weight, Part, Rows
from tfd.model.mtp import MtpWeights
from tfd.model.stack import StackWeights


def expect(cfg: HybridConfig, naming: Naming) -> dict[str, Shape]:
    need = Expect(naming)
    need.shapes.update(qwen3_5.expect(cfg, naming))
    for i, kind in enumerate(cfg.layer_types):
        if kind != LINEAR:
            continue
        at = f"{naming.trunk}layers.{i}.linear_attn"
        for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"):
            del need.shapes[f"{at}.{name}.weight"]
        key, value = cfg.key_heads * cfg.key_dim, cfg.value_heads * cfg.value_dim
        need.add(f"{at}.in_proj_qkvz.weight", 2 * key + 2 * value, cfg.hidden)
        need.add(f"{at}.in_proj_ba.weight", 2 * cfg.value_heads, cfg.hidden)
    return need.shapes


def regroup(cfg: HybridConfig, qkvz: Part, ba: Part) -> tuple[Part, Part, Part, Part]:
    """(qkv, z, b, a) in Qwen3.5's layout from the per-key-head groups: rows of a float weight
    moved, of an FP8 one picked after its product (``Rows``: rows cannot leave their scale blocks)."""
    ratio = cfg.value_heads // cfg.key_heads
    width = ratio * cfg.value_dim
    qkvz_rows = torch.arange(qkvz.shape[0]).view(cfg.key_heads, 2 * cfg.key_dim + 2 * width)
    q, k, v, z = torch.split(qkvz_rows, [cfg.key_dim, cfg.key_dim, width, width], dim=1)
    b, a = torch.split(torch.arange(ba.shape[0]).view(cfg.key_heads, 2 * ratio), [ratio, ratio], dim=1)
    qkv = torch.cat([part.reshape(-1) for part in (q, k, v)])
    return (_picked(qkvz, qkv), _picked(qkvz, z.reshape(-1)), _picked(ba, b.reshape(-1)),
            _picked(ba, a.reshape(-1)))


def _picked(weight: Part, rows: torch.Tensor) -> Part:
    """``weight``'s output ``rows`` in that order."""
    if isinstance(weight, torch.Tensor):
        return weight[rows.to(weight.device)]
    if isinstance(weight, Fp8Weight):
        return Rows(weight, rows.to(weight.data.device))
    raise TypeError(f"a stored projection is a tensor or an Fp8Weight, not {type(weight).__name__}")


def build(cfg: HybridConfig, naming: Naming, get: Get) -> tuple[StackWeights, MtpWeights | None]:
    return qwen3_5.build(cfg, naming, get, lambda at: regroup(cfg, get.linear(f"{at}.in_proj_qkvz.weight"),
                                                             get.linear(f"{at}.in_proj_ba.weight")))

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


def regroup(cfg: HybridConfig, qkvz: torch.Tensor, ba: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(qkv, z, b, a) in Qwen3.5's layout from the per-key-head groups."""
    ratio = cfg.value_heads // cfg.key_heads
    width = ratio * cfg.value_dim
    groups = qkvz.view(cfg.key_heads, 2 * cfg.key_dim + 2 * width, -1)
    q, k, v, z = torch.split(groups, [cfg.key_dim, cfg.key_dim, width, width], dim=1)
    hidden = qkvz.shape[1]
    qkv = torch.cat([part.reshape(-1, hidden) for part in (q, k, v)])
    b, a = torch.split(ba.view(cfg.key_heads, 2 * ratio, -1), [ratio, ratio], dim=1)
    return qkv, z.reshape(-1, hidden), b.reshape(-1, hidden), a.reshape(-1, hidden)


def build(cfg: HybridConfig, naming: Naming, get: Get) -> tuple[StackWeights, MtpWeights | None]:
    return qwen3_5.build(cfg, naming, get, lambda at: regroup(cfg, get(f"{at}.in_proj_qkvz.weight"),
                                                             get(f"{at}.in_proj_ba.weight")))

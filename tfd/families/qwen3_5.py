"""Qwen3.5, dense and MoE (``qwen3_5``, ``qwen3_5_moe``): GDN and gated attention layers between
zero-centred RMSNorms, a dense SwiGLU or a routed MoE with a shared expert (model.md 2.4-2.7)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from tfd.families.config import LINEAR, HybridConfig
from tfd.families.naming import (
    Expect,
    Get,
    Naming,
    Shape,
    attention_weights,
    dense_weights,
    gdn_projections,
    gdn_weights,
    moe_weights,
)
from tfd.model.attention import AttentionWeights
from tfd.model.gdn import GdnWeights
from tfd.model.mlp import DenseMlp, MoeWeights
from tfd.model.rope import Rotary
from tfd.model.stack import LayerWeights, StackWeights

Projections = Callable[[str], tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]


def expect(cfg: HybridConfig, naming: Naming) -> dict[str, Shape]:
    """Every float tensor the trunk needs, by checkpoint name, with its shape."""
    need = Expect(naming)
    trunk, h = naming.trunk, cfg.hidden
    need.add(f"{trunk}embed_tokens.weight", cfg.vocab, h)
    need.add(f"{trunk}norm.weight", h)
    if not cfg.tie_embeddings:
        need.add("lm_head.weight", cfg.vocab, h)
    for i, kind in enumerate(cfg.layer_types):
        at = f"{trunk}layers.{i}"
        need.add(f"{at}.input_layernorm.weight", h)
        need.add(f"{at}.post_attention_layernorm.weight", h)
        if kind == LINEAR:
            need.gdn_projections(cfg, f"{at}.linear_attn")
            need.gdn(cfg, f"{at}.linear_attn")
        else:
            need.attention(cfg, f"{at}.self_attn", h)
        if cfg.is_moe(i):
            need.moe(cfg, f"{at}.mlp", naming.fused_experts)
        else:
            assert cfg.intermediate is not None
            need.dense(f"{at}.mlp", h, cfg.intermediate)
    return need.shapes


def build(cfg: HybridConfig, naming: Naming, get: Get,
          projections: Projections | None = None) -> StackWeights:
    """The trunk's weights from tensors named as ``expect`` says.

    ``projections`` gives a GDN layer's (qkv, z, b, a) from its name prefix, for checkpoints that
    store them otherwise (Qwen3-Next).
    """
    projections = projections or (lambda at: gdn_projections(get, at))
    trunk = naming.trunk
    layers = []
    for i, kind in enumerate(cfg.layer_types):
        at = f"{trunk}layers.{i}"
        mixer: GdnWeights | AttentionWeights
        if kind == LINEAR:
            mixer = gdn_weights(cfg, get, f"{at}.linear_attn", *projections(f"{at}.linear_attn"))
        else:
            mixer = attention_weights(cfg, get, f"{at}.self_attn")
        layers.append(LayerWeights(f"layer{i}", mixer, ffn(cfg, naming, get, i, f"{at}.mlp"),
                                   input_norm=get(f"{at}.input_layernorm.weight"),
                                   post_norm=get(f"{at}.post_attention_layernorm.weight")))
    embed = get(f"{trunk}embed_tokens.weight")
    return StackWeights(
        embed=embed, layers=tuple(layers), head=embed if cfg.tie_embeddings else get("lm_head.weight"),
        rotary=Rotary.of(cfg.head_dim, cfg.rotary_fraction, cfg.rope_theta, embed.device), eps=cfg.eps,
        final_norm=get(f"{trunk}norm.weight"))


def ffn(cfg: HybridConfig, naming: Naming, get: Get, layer: int, at: str) -> DenseMlp | MoeWeights:
    if cfg.is_moe(layer):
        return moe_weights(cfg, get, at, naming.fused_experts)
    return dense_weights(get, at)

"""Qwen3.5, dense and MoE (``qwen3_5``, ``qwen3_5_moe``): GDN and gated attention layers between
zero-centred RMSNorms, a dense SwiGLU or a routed MoE with a shared expert (model.md 2.4-2.8),
and an MTP head of one attention layer."""

from __future__ import annotations

from collections.abc import Callable

from tfd.families.config import LINEAR, HybridConfig
from tfd.families.naming import (
    Expect,
    Get,
    Naming,
    Shape,
    attention_weights,
    ffn_weights,
    gdn_projections,
    gdn_weights,
    moe_weights,
)
from tfd.model.attention import AttentionWeights
from tfd.model.fp8 import Part
from tfd.model.gdn import GdnWeights
from tfd.model.mlp import DenseMlp, MoeWeights
from tfd.model.mtp import MtpWeights
from tfd.model.rope import Rotary
from tfd.model.stack import LayerWeights, StackWeights

Projections = Callable[[str], tuple[Part, Part, Part, Part]]  # a GDN layer's (qkv, z, b, a), by its prefix


def expect(cfg: HybridConfig, naming: Naming) -> dict[str, Shape]:
    """Every float tensor the model needs, by checkpoint name, with its shape."""
    need = Expect(naming)
    trunk, h = naming.trunk, cfg.hidden
    need.add(f"{trunk}embed_tokens.weight", cfg.vocab, h)
    need.add(f"{trunk}norm.weight", h)
    if not cfg.tie_embeddings:
        need.add("lm_head.weight", cfg.vocab, h)
    for i, kind in enumerate(cfg.layer_types):
        expect_layer(need, cfg, f"{trunk}layers.{i}", kind, cfg.is_moe(i))
    if naming.has_mtp:
        for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            need.add(f"mtp.{norm}.weight", h)
        need.add("mtp.fc.weight", h, 2 * h)
        expect_layer(need, cfg, "mtp.layers.0", "full_attention", cfg.experts > 0)
    return need.shapes


def expect_layer(need: Expect, cfg: HybridConfig, at: str, kind: str, moe: bool) -> None:
    need.add(f"{at}.input_layernorm.weight", cfg.hidden)
    need.add(f"{at}.post_attention_layernorm.weight", cfg.hidden)
    if kind == LINEAR:
        need.gdn_projections(cfg, f"{at}.linear_attn")
        need.gdn(cfg, f"{at}.linear_attn")
    else:
        need.attention(cfg, f"{at}.self_attn", cfg.hidden)
    if moe:
        need.moe(cfg, f"{at}.mlp")
    else:
        assert cfg.intermediate is not None
        need.dense(f"{at}.mlp", cfg.hidden, cfg.intermediate)


def build(cfg: HybridConfig, naming: Naming, get: Get,
          projections: Projections | None = None) -> tuple[StackWeights, MtpWeights | None]:
    """The weights from tensors named as ``expect`` says, and the MTP head when there is one.

    ``projections`` gives a GDN layer's (qkv, z, b, a) from its name prefix, for checkpoints that
    store them otherwise (Qwen3-Next).
    """
    project = projections or (lambda at: gdn_projections(get, at))
    trunk = naming.trunk
    layers = tuple(
        build_layer(cfg, naming, get, project, f"{trunk}layers.{i}", f"layer{i}", kind, cfg.is_moe(i))
        for i, kind in enumerate(cfg.layer_types))
    embed = get(f"{trunk}embed_tokens.weight")
    stack = StackWeights(
        embed=embed, layers=layers, head=embed if cfg.tie_embeddings else get("lm_head.weight"),
        rotary=Rotary.of(cfg.head_dim, cfg.rotary_fraction, cfg.rope_theta, embed.device), eps=cfg.eps,
        final_norm=get(f"{trunk}norm.weight"))
    head = None
    if naming.has_mtp:
        layer = build_layer(cfg, naming, get, project, "mtp.layers.0", "mtp", "full_attention",
                            cfg.experts > 0)
        head = MtpWeights(embed_norm=get("mtp.pre_fc_norm_embedding.weight"),
                          hidden_norm=get("mtp.pre_fc_norm_hidden.weight"), layer=layer,
                          fc=get.linear("mtp.fc.weight"), final_norm=get("mtp.norm.weight"))
    return stack, head


def build_layer(cfg: HybridConfig, naming: Naming, get: Get, project: Projections, at: str, name: str,
                kind: str, moe: bool) -> LayerWeights:
    mixer: GdnWeights | AttentionWeights
    if kind == LINEAR:
        mixer = gdn_weights(cfg, get, f"{at}.linear_attn", *project(f"{at}.linear_attn"))
    else:
        mixer = attention_weights(cfg, get, f"{at}.self_attn")
    ffn: DenseMlp | MoeWeights = moe_weights(cfg, naming, get, f"{at}.mlp") if moe \
        else ffn_weights(get, f"{at}.mlp")
    return LayerWeights(name, mixer, ffn, input_norm=get(f"{at}.input_layernorm.weight"),
                        post_norm=get(f"{at}.post_attention_layernorm.weight"))

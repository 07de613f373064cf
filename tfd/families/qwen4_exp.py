"""Qwen3.8-Flash-Next (``qwen4_exp``): residual streams joined by hyper-connections, GDN and QSA
layers, a routed MoE in every layer, PLE before one layer, and a mixer instead of a final norm
(reference/model.md section 3).

The PLE hash constants (table sizes, offsets, multipliers) are computed from the config, as the
reference does; when the checkpoint also stores them they must agree.
"""

from __future__ import annotations

import math

import attrs
import torch

from tfd.checkpoint import CheckpointError
from tfd.families.config import INDEXED, LINEAR, HybridConfig, Ple
from tfd.families.naming import (
    Expect,
    Get,
    Naming,
    Shape,
    attention_weights,
    gdn_projections,
    gdn_weights,
    moe_weights,
)
from tfd.model.attention import AttentionWeights
from tfd.model.fp8 import join
from tfd.model.gdn import GdnWeights
from tfd.model.hyper import HyperWeights
from tfd.model.mtp import MtpWeights
from tfd.model.ple import PleWeights
from tfd.model.qsa import IndexerWeights
from tfd.model.rope import Rotary
from tfd.model.stack import LayerWeights, StackWeights

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_LAYER_PRIME = 10007


def expect(cfg: HybridConfig, naming: Naming) -> dict[str, Shape]:
    need = Expect(naming)
    trunk, h = naming.trunk, cfg.hidden
    need.add(f"{trunk}embed_tokens.weight", cfg.vocab, h)
    need.add("lm_head.weight", cfg.vocab, h)
    _hyper(need, cfg, f"{trunk}hyper_connection_mixer", inject=False)
    for i, kind in enumerate(cfg.layer_types):
        expect_layer(need, cfg, f"{trunk}layers.{i}", kind)
        if cfg.ple is not None and i in cfg.ple.layers:
            ple, wide = f"{trunk}layers.{i}.ple", cfg.streams * h
            need.add(f"{ple}.key_proj.weight", wide, cfg.ple.embed)
            need.add(f"{ple}.value_proj.weight", h, cfg.ple.embed)
            for norm in ("norm_key", "norm_query", "norm_conv"):
                need.add(f"{ple}.{norm}.weight", wide)
            need.add(f"{ple}.conv1d.weight", wide, 1, cfg.ple.kernel)
            tables = PleTables.of(cfg.ple, cfg.vocab, cfg.ple.layers.index(i))
            names = table_names(naming, ple)
            if tables.rows % len(names):  # the shapes expected are the table's rows in equal parts
                raise CheckpointError(f"{names[0]}: the n-gram table's {tables.rows} rows do not split into "
                                      f"{len(names)} equal shards")
            for name in names:
                need.add(name, tables.rows // len(names), tables.dim)
    if naming.has_mtp:
        need.add("mtp.pre_fc_norm_embedding.weight", h)
        need.add("mtp.pre_fc_norm_hidden.weight", cfg.streams * h)
        need.add("mtp.fc_embedding.weight", h, h)
        need.add("mtp.fc_hidden.weight", h, h)
        expect_layer(need, cfg, "mtp.layers.0", INDEXED)
        _hyper(need, cfg, "mtp.hyper_connection_mixer", inject=False)
    return need.shapes


def expect_layer(need: Expect, cfg: HybridConfig, at: str, kind: str) -> None:
    _hyper(need, cfg, f"{at}.attn_hyper_connection", inject=True)
    _hyper(need, cfg, f"{at}.mlp_hyper_connection", inject=True)
    if kind == LINEAR:
        need.gdn_projections(cfg, f"{at}.linear_attn")
        need.gdn(cfg, f"{at}.linear_attn")
    else:
        need.attention(cfg, f"{at}.self_attn", cfg.hidden)
        if cfg.indexer is not None:
            index = cfg.indexer
            queries_and_key = (index.heads + 1) * index.dim
            need.add(f"{at}.self_attn.indexer.index_qk_proj.weight", queries_and_key, cfg.hidden)
            need.add(f"{at}.self_attn.indexer.q_layernorm.weight", index.dim)
            need.add(f"{at}.self_attn.indexer.k_layernorm.weight", index.dim)
    need.moe(cfg, f"{at}.mlp")


def _hyper(need: Expect, cfg: HybridConfig, at: str, inject: bool) -> None:
    wide = cfg.streams * cfg.hidden
    need.add(f"{at}.hc_norm.weight", wide)
    need.add(f"{at}.input_mix_weight_down.weight", cfg.stream_rank, wide)
    need.add(f"{at}.input_mix_weight_up.weight", wide, cfg.stream_rank)
    if inject:
        need.add(f"{at}.block_inject_weight.weight", cfg.streams, wide)


def build(cfg: HybridConfig, naming: Naming, get: Get) -> tuple[StackWeights, MtpWeights | None]:
    trunk = naming.trunk
    layers = []
    for i, kind in enumerate(cfg.layer_types):
        at = f"{trunk}layers.{i}"
        ple = None
        if cfg.ple is not None and i in cfg.ple.layers:
            ple = _ple(cfg, cfg.ple, get, f"{at}.ple", cfg.ple.layers.index(i))
        layers.append(attrs.evolve(build_layer(cfg, naming, get, at, f"layer{i}", kind), ple=ple))
    embed = get(f"{trunk}embed_tokens.weight")
    stack = StackWeights(
        embed=embed, layers=tuple(layers), head=get("lm_head.weight"),
        rotary=Rotary.of(cfg.head_dim, cfg.rotary_fraction, cfg.rope_theta, embed.device), eps=cfg.eps,
        streams=cfg.streams, mixer=hyper_weights(cfg, get, f"{trunk}hyper_connection_mixer", inject=False))
    head = None
    if naming.has_mtp:
        head = MtpWeights(embed_norm=get("mtp.pre_fc_norm_embedding.weight"),
                          hidden_norm=get("mtp.pre_fc_norm_hidden.weight"),
                          layer=build_layer(cfg, naming, get, "mtp.layers.0", "mtp", INDEXED),
                          fc_embed=get.linear("mtp.fc_embedding.weight"),
                          fc_hidden=get.linear("mtp.fc_hidden.weight"),
                          mixer=hyper_weights(cfg, get, "mtp.hyper_connection_mixer", inject=False))
    return stack, head


def build_layer(cfg: HybridConfig, naming: Naming, get: Get, at: str, name: str, kind: str) -> LayerWeights:
    mixer: GdnWeights | AttentionWeights
    if kind == LINEAR:
        mixer = gdn_weights(cfg, get, f"{at}.linear_attn", *gdn_projections(get, f"{at}.linear_attn"))
    else:
        mixer = attention_weights(cfg, get, f"{at}.self_attn")
        if cfg.indexer is not None:
            index, prefix = cfg.indexer, f"{at}.self_attn.indexer"
            mixer = attrs.evolve(mixer, indexer=IndexerWeights(
                qk=get.linear(f"{prefix}.index_qk_proj.weight"), q_norm=get(f"{prefix}.q_layernorm.weight"),
                k_norm=get(f"{prefix}.k_layernorm.weight"), heads=index.heads, dim=index.dim,
                budget=index.budget, block=index.block, eps=cfg.eps))
    return LayerWeights(name, mixer, moe_weights(cfg, naming, get, f"{at}.mlp"),
                        attn_hyper=hyper_weights(cfg, get, f"{at}.attn_hyper_connection", inject=True),
                        mlp_hyper=hyper_weights(cfg, get, f"{at}.mlp_hyper_connection", inject=True))


def hyper_weights(cfg: HybridConfig, get: Get, at: str, inject: bool) -> HyperWeights:
    down = get.linear(f"{at}.input_mix_weight_down.weight")
    # the injection's rows after the mix's down rows: one product reads both
    projections = join((down, get.linear(f"{at}.block_inject_weight.weight"))) if inject else down
    return HyperWeights(norm=get(f"{at}.hc_norm.weight"), projections=projections,
                        up=get.linear(f"{at}.input_mix_weight_up.weight"), streams=cfg.streams,
                        width=cfg.hidden, eps=cfg.eps)


def table_names(naming: Naming, at: str) -> list[str]:
    """The n-gram table's tensors in the checkpoint: one, or its equal shards in order (which the
    loader joins into the one, ``Naming.joined``)."""
    prefix = f"{at}.ple_embedding.ngram_embedding"
    shards = naming.shards.get(prefix, 0)
    return [f"{prefix}.shard_{j}.weight" for j in range(shards)] if shards else [f"{prefix}.weight"]


def _ple(cfg: HybridConfig, ple: Ple, get: Get, at: str, index: int) -> PleWeights:
    tables = PleTables.of(ple, cfg.vocab, index)
    table = get(f"{at}.ple_embedding.ngram_embedding.weight")  # shards joined at load
    device = table.device
    return PleWeights(
        key=get.linear(f"{at}.key_proj.weight"), value=get.linear(f"{at}.value_proj.weight"),
        norm_key=get(f"{at}.norm_key.weight"), norm_query=get(f"{at}.norm_query.weight"),
        norm_conv=get(f"{at}.norm_conv.weight"), conv=get(f"{at}.conv1d.weight")[:, 0, :],
        table=table, multipliers=tables.multipliers,
        sizes=torch.tensor(tables.sizes, dtype=torch.long, device=device),
        offsets=torch.tensor(tables.offsets, dtype=torch.long, device=device),
        heads_per_ngram=ple.heads_per_ngram, eos=cfg.eos[0], dilation=ple.ngram, streams=cfg.streams,
        width=cfg.hidden, eps=cfg.eps)


class PleTables:
    """The hashed n-gram table's constants for the ``index``-th PLE layer (model.md 3.6)."""

    def __init__(self, sizes: tuple[int, ...], multipliers: tuple[int, ...], rows: int, dim: int) -> None:
        self.sizes = sizes
        self.offsets = tuple(sum(sizes[:i]) for i in range(len(sizes)))
        self.multipliers = multipliers
        self.rows = rows
        self.dim = dim

    @classmethod
    def of(cls, ple: Ple, vocab: int, index: int) -> PleTables:
        heads = (ple.ngram - 1) * ple.heads_per_ngram
        sizes, prime = [], ple.vocab_base - 1
        for _ in range(index * heads):  # earlier PLE layers took the primes before these
            prime = _next_prime(prime)
        for _ in range(heads):
            prime = _next_prime(prime)
            sizes.append(prime)
        rows = math.ceil(sum(sizes) / ple.divisor) * ple.divisor
        bound = max(1, ((1 << 63) - 1) // max(vocab, 1) // 2)
        base = ple.seed + _LAYER_PRIME * index
        multipliers = tuple(2 * (splitmix64((base + _GAMMA * (i + 1)) & _MASK64) % bound) + 1
                            for i in range(ple.ngram))
        return cls(tuple(sizes), multipliers, rows, ple.embed // heads)


def splitmix64(value: int) -> int:
    value = (value + _GAMMA) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def _next_prime(after: int) -> int:
    candidate = after + 1
    while not _is_prime(candidate):
        candidate += 1
    return candidate


def _is_prime(value: int) -> bool:
    if value < 2 or value % 2 == 0:
        return value == 2
    return all(value % d for d in range(3, math.isqrt(value) + 1, 2))

"""A hybrid model's shape, read from a checkpoint's text config (the fields every family uses).

Field names follow transformers' configs (reference/model.md sections 3.1 and 4). A missing or
malformed field is refused with ``ConfigError`` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

LINEAR, ATTENTION, INDEXED = "linear_attention", "full_attention", "indexed_attention"


class ConfigError(ValueError):
    """A config field the family needs is missing or has the wrong type."""


@attrs.frozen
class Indexer:
    heads: int
    dim: int
    budget: int
    block: int


@attrs.frozen
class Ple:
    layers: tuple[int, ...]  # zero-based decoder layers that add PLE
    embed: int
    kernel: int
    ngram: int
    heads_per_ngram: int
    vocab_base: int
    divisor: int
    seed: int


@attrs.frozen
class HybridConfig:
    family: str
    vocab: int
    hidden: int
    layer_types: tuple[str, ...]
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float
    rotary_fraction: float
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int
    gate_activation: str
    eps: float
    tie_embeddings: bool
    eos: tuple[int, ...]
    intermediate: int | None = None  # dense MLP width
    experts: int = 0
    top_k: int = 0
    expert_inner: int = 0
    shared_inner: int = 0
    norm_top_k: bool = True
    dense_layers: frozenset[int] = frozenset()  # MoE models: layers with a dense MLP instead
    streams: int = 1
    stream_rank: int = 0
    indexer: Indexer | None = None
    ple: Ple | None = None
    mtp_layers: int = 0
    held_experts: tuple[int, int] | None = None  # expert parallel: the routed experts a rank holds whole

    @property
    def layers(self) -> int:
        return len(self.layer_types)

    def is_moe(self, layer: int) -> bool:
        return self.experts > 0 and layer not in self.dense_layers


def read_config(family: str, text: Mapping[str, Any]) -> HybridConfig:
    """The shape of ``family`` from its text config ``text``."""
    get = _Fields(text)
    layers = get.int("num_hidden_layers")
    types = text.get("layer_types")
    if types is None:
        interval = int(text.get("full_attention_interval", 4))
        types = [LINEAR if (i + 1) % interval else ATTENTION for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers:
        raise ConfigError(f"layer_types must list {layers} layer kinds")
    rope = text.get("rope_parameters") or {}
    theta = float(rope.get("rope_theta", text.get("rope_theta", 10000.0)))
    fraction = float(rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 1.0)))
    eos = text.get("eos_token_id")
    fields: dict[str, Any] = dict(
        family=family, vocab=get.int("vocab_size"), hidden=get.int("hidden_size"),
        layer_types=tuple(INDEXED if family == "qwen4_exp" and kind == ATTENTION else kind for kind in types),
        heads=get.int("num_attention_heads"), kv_heads=get.int("num_key_value_heads"),
        head_dim=int(text.get("head_dim") or get.int("hidden_size") // get.int("num_attention_heads")),
        rope_theta=theta, rotary_fraction=fraction,
        key_heads=get.int("linear_num_key_heads"), value_heads=get.int("linear_num_value_heads"),
        key_dim=get.int("linear_key_head_dim"), value_dim=get.int("linear_value_head_dim"),
        conv_kernel=get.int("linear_conv_kernel_dim"),
        gate_activation=str(text.get("output_gate_type") or text.get("hidden_act", "silu")),
        eps=float(text.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(text.get("tie_word_embeddings", False)),
        eos=tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),)),
        mtp_layers=int(text.get("mtp_num_hidden_layers", 0)),
    )
    if family == "qwen3_5":
        fields["intermediate"] = get.int("intermediate_size")
    else:
        fields.update(experts=get.int("num_experts"), top_k=get.int("num_experts_per_tok"),
                      expert_inner=get.int("moe_intermediate_size"),
                      shared_inner=get.int("shared_expert_intermediate_size"),
                      norm_top_k=bool(text.get("norm_topk_prob", True)) or family == "qwen3_5_moe")
    if family == "qwen3_next":
        step = int(text.get("decoder_sparse_step", 1))
        only = set(text.get("mlp_only_layers") or [])
        fields["dense_layers"] = frozenset(i for i in range(layers) if i in only or (i + 1) % step)
        if fields["dense_layers"]:
            fields["intermediate"] = get.int("intermediate_size")
    if family == "qwen4_exp":
        fields.update(streams=get.int("hc_count"), stream_rank=get.int("hc_lowrank"))
        if text.get("indexer_budget") is not None:
            fields["indexer"] = Indexer(get.int("indexer_n_heads"), get.int("indexer_head_dim"),
                                        get.int("indexer_budget"), get.int("indexer_compress_ratio"))
        ple_ids = text.get("ple_layer_ids") or []
        if len(ple_ids) > 1:  # every released config has one; lanes keep one PLE tail
            raise ConfigError(f"ple_layer_ids {ple_ids}: tfd serves one PLE layer")
        if ple_ids:
            fields["ple"] = Ple(tuple(sorted(i - 1 for i in ple_ids)),
                                int(text.get("ple_embed_dim") or get.int("hidden_size")),
                                int(text.get("ple_conv_kernel_size", 4)), int(text.get("ngram_size", 3)),
                                get.int("heads_per_ngram"), get.int("ngram_vocab_size_base"),
                                int(text.get("make_ngram_vocab_size_divisible_by", 128)),
                                int(text.get("seed", 1234)))
            if not fields["eos"]:
                raise ConfigError("eos_token_id must be set when ple_layer_ids are")
    return HybridConfig(**fields)


class _Fields:
    def __init__(self, text: Mapping[str, Any]) -> None:
        self.text = text

    def int(self, name: str) -> int:
        value = self.text.get(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config field {name} must be an integer, found {value!r}")
        return value

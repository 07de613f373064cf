"""Benchmark shapes: text configs of released checkpoints, for ``tfd bench --random-weights``.

No real checkpoint can be fetched here, so a shape is its config with weights drawn on the device.
A shape whose weights do not fit the device loses whole groups of layers (one attention layer
and the GDN layers before it) until they do; ``fit`` says what it cut.
Sources: reference/model.md sections 3.1 and 6 (configs copied from the released checkpoints).
Flash Next's 51 B-parameter n-gram table does not fit beside any layers, so a shape too big first
keeps 1/64 of the table's rows (a step looks up the same 16 rows a token at any table size).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from tfd.families.hybrid import expected_tensors

_ROPE = {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
         "mrope_section": [11, 11, 10], "mrope_interleaved": True}
_QWEN3_5: dict[str, Any] = {
    "vocab_size": 248320, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    "hidden_act": "silu", "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "rope_parameters": _ROPE, "eos_token_id": 248044,
}
PATTERN = ["linear_attention"] * 3 + ["full_attention"]


def _layers(count: int) -> dict[str, Any]:
    return {"num_hidden_layers": count, "layer_types": PATTERN * (count // 4)}


PRESETS: Mapping[str, tuple[str, dict[str, Any]]] = {
    "qwen3_5-9b": ("qwen3_5", {
        **_QWEN3_5, **_layers(32), "model_type": "qwen3_5_text", "hidden_size": 4096,
        "num_attention_heads": 16, "num_key_value_heads": 4, "intermediate_size": 12288}),
    "qwen3_5-35b-a3b": ("qwen3_5_moe", {
        **_QWEN3_5, **_layers(40), "model_type": "qwen3_5_moe_text", "hidden_size": 2048,
        "num_attention_heads": 16, "num_key_value_heads": 2, "num_experts": 256, "num_experts_per_tok": 8,
        "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "norm_topk_prob": True}),
    "qwen3_next-80b-a3b": ("qwen3_next", {
        **_QWEN3_5, **_layers(48), "model_type": "qwen3_next", "hidden_size": 2048, "vocab_size": 151936,
        "eos_token_id": 151645, "num_attention_heads": 16, "num_key_value_heads": 2,
        "intermediate_size": 5120, "num_experts": 512, "num_experts_per_tok": 10,
        "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.25,
        "rope_parameters": None}),
    "qwen3_8-flash-next": ("qwen4_exp", {
        **_QWEN3_5, **_layers(48), "model_type": "qwen4_exp_text", "hidden_size": 2560,
        "num_attention_heads": 24, "num_key_value_heads": 2, "linear_num_value_heads": 48,
        "output_gate_type": "sigmoid", "num_experts": 512, "num_experts_per_tok": 10, "norm_topk_prob": True,
        "moe_intermediate_size": 640, "shared_expert_intermediate_size": 640,
        "hc_count": 4, "hc_lowrank": 320,
        "indexer_n_heads": 4, "indexer_kv_heads": 1, "indexer_head_dim": 128, "indexer_budget": 2048,
        "indexer_compress_ratio": 4, "ple_layer_ids": [2], "ple_embed_dim": 2560, "ple_conv_kernel_size": 4,
        "ngram_size": 3, "heads_per_ngram": 8, "ngram_vocab_size_base": 20_000_000,
        "make_ngram_vocab_size_divisible_by": 128, "split_ngram_parts": 128, "mamba_ssm_dtype": "float32"}),
}
TABLE_CUT = 64  # a shape too big keeps 1/64 of its n-gram table's rows: a lookup costs the same at any size


@attrs.frozen
class Shape:
    name: str
    family: str
    config: dict[str, Any]
    weight_bytes: int
    cut: str | None  # what was cut to fit, in words


def weight_bytes(family: str, config: Mapping[str, Any], element: int = 2) -> int:
    _, _, shapes = expected_tensors(family, config, set())
    return sum(math.prod(shape) for shape in shapes.values()) * element


def fit(name: str, budget: int) -> Shape:
    """Preset ``name`` with as many of its layers as fit ``budget`` bytes of bf16 weights."""
    if name not in PRESETS:
        raise ValueError(f"no shape {name!r}; known: {', '.join(PRESETS)}")
    family, config = PRESETS[name]
    layers = config["num_hidden_layers"]
    size = weight_bytes(family, config)
    cuts = []
    if size > budget and config.get("ngram_vocab_size_base"):
        base = config["ngram_vocab_size_base"]
        config = {**config, "ngram_vocab_size_base": base // TABLE_CUT}
        cuts.append(f"n-gram table {base:,} -> {base // TABLE_CUT:,} rows a head")
        size = weight_bytes(family, config)
    while size > budget and layers > len(PATTERN):
        layers -= len(PATTERN)
        size = weight_bytes(family, {**config, **_layers(layers)})
    if size > budget:
        raise ValueError(f"shape {name} does not fit {budget / 2**30:.1f} GiB even with {layers} layers")
    if layers != config["num_hidden_layers"]:
        cuts.append(f"{layers} of {config['num_hidden_layers']} layers kept")
        config = {**config, **_layers(layers)}
    cut = f"{name}: {', '.join(cuts)} ({size / 2**30:.1f} GiB of weights fit {budget / 2**30:.1f} GiB)" \
        if cuts else None
    return Shape(name, family, config, size, cut)

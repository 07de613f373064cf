"""Released models' shapes, served or benchmarked with random weights (``--shape NAME``).

No real checkpoint can be fetched here, so a shape is its released text config with weights drawn on
the device. A shape whose weights do not fit the device loses whole groups of layers (one attention
layer and the GDN layers before it) until they do; ``fit`` says what it cut. Flash Next's 51
B-parameter n-gram table does not fit beside any layers, so a shape too big first keeps 1/64 of the
table's rows (a step looks up the same 16 rows a token at any table size).

``write_shape`` makes a shape a checkpoint directory without weights, which ``tfd serve --shape``
loads with random weights through the whole daemon: config.json (with an MTP head, as the released
models have), the demo's chat template, and a tokenizer whose vocabulary covers the shape's: the
demo's byte-level BPE (4,096 tokens, which is all text encodes to) with an entry ``<ID>`` for every
other id, so every drawn id detokenizes.
Sources: reference/model.md sections 3.1 and 6 (configs copied from the released checkpoints).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from tfd import demo

if TYPE_CHECKING:  # torch loads only once a shape is sized or drawn
    import torch

    from tfd.model.parallel import Parallel

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
WEIGHT_SHARE = 0.7  # of a GPU's memory, for a shape's weights; the rest holds pool, graphs, scratch
CPU_WEIGHT_BUDGET = 8 << 30


TABLE = "ple_embedding.ngram_embedding.weight"  # Flash Next's n-gram table: looked up, never multiplied


@attrs.frozen
class Sizes:
    """A model's trunk weights (no MTP head), for its roofline: bytes as held, how many weights, and
    the bytes of one routed expert's three products (0 without experts). Flash Next's n-gram table
    is a lookup, as the embedding is: its bytes and weights (counted in the two totals too) and the
    bytes one token's lookups read from it (0 without one)."""

    bytes: int
    params: int
    expert_bytes: int
    table_bytes: int = 0
    table_params: int = 0
    table_token_bytes: int = 0


@attrs.frozen
class Shape:
    name: str
    family: str
    config: dict[str, Any]
    cut: str | None  # what was cut to fit, in words
    sizes: Sizes

    @property
    def weight_bytes(self) -> int:
        return self.sizes.bytes


def weight_budget(device: torch.device) -> int:
    """The bytes a shape's weights may take on ``device``."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory * WEIGHT_SHARE)
    return CPU_WEIGHT_BUDGET


def sizes(family: str, config: Mapping[str, Any], element: int = 2, fp8: bool = False,
          parallel: Parallel | None = None) -> Sizes:
    """The trunk's weights (no MTP head) in elements of ``element`` bytes; ``fp8``: those Qwen's -FP8
    releases store in FP8 (``tfd.quantization.released_fp8``) at a byte an element, with their scales;
    ``parallel``: those one rank holds (its shares, and what every rank holds whole)."""
    from tfd.families.hybrid import expected_tensors  # torch: only once a shape is sized
    from tfd.families.sharding import rank_config, rank_shape, read_by
    from tfd.quantization import fp8_bytes, released_fp8

    cfg, _, shapes = expected_tensors(family, config, set())
    if parallel is not None and parallel.size > 1:
        shapes = {name: rank_shape(cfg, name, shape, parallel) for name, shape in shapes.items()
                  if read_by(cfg, parallel, name)}
        cfg = rank_config(cfg, parallel)

    def held(name: str, shape: tuple[int, ...]) -> int:
        return fp8_bytes(shape) if fp8 and released_fp8(name, shape) else math.prod(shape) * element

    expert = (cfg.expert_inner, cfg.hidden)
    expert_bytes = 2 * fp8_bytes(expert) + fp8_bytes(expert[::-1]) if fp8 \
        else 3 * math.prod(expert) * element
    tables = {name: shape for name, shape in shapes.items() if name.endswith(TABLE)}
    # a token reads a row a head of each n-gram order (bigrams, trigrams, ...) from each table
    looked_up = 0 if cfg.ple is None else (cfg.ple.ngram - 1) * cfg.ple.heads_per_ngram
    return Sizes(sum(held(name, shape) for name, shape in shapes.items()),
                 sum(math.prod(shape) for shape in shapes.values()), expert_bytes if cfg.experts else 0,
                 sum(held(name, shape) for name, shape in tables.items()),
                 sum(math.prod(shape) for shape in tables.values()),
                 sum(looked_up * shape[-1] * element for shape in tables.values()))


def weight_bytes(family: str, config: Mapping[str, Any], element: int = 2, fp8: bool = False) -> int:
    """Bytes of the trunk's weights (no MTP head), as ``sizes`` counts them."""
    return sizes(family, config, element, fp8).bytes


def fit(name: str, budget: int, fp8: bool = False) -> Shape:
    """Preset ``name`` with as many of its layers as fit ``budget`` bytes of bf16 weights (``fp8``:
    FP8 where the -FP8 releases have it)."""
    if name not in PRESETS:
        raise ValueError(f"no shape {name!r}; known: {', '.join(PRESETS)}")
    family, config = PRESETS[name]
    layers = config["num_hidden_layers"]
    found = sizes(family, config, fp8=fp8)
    cuts = []
    if found.bytes > budget and config.get("ngram_vocab_size_base"):
        base = config["ngram_vocab_size_base"]
        config = {**config, "ngram_vocab_size_base": base // TABLE_CUT}
        cuts.append(f"n-gram table {base:,} -> {base // TABLE_CUT:,} rows a head")
        found = sizes(family, config, fp8=fp8)
    while found.bytes > budget and layers > len(PATTERN):
        layers -= len(PATTERN)
        found = sizes(family, {**config, **_layers(layers)}, fp8=fp8)
    size = found.bytes
    if size > budget:
        raise ValueError(f"shape {name} does not fit {budget / 2**30:.1f} GiB even with {layers} layers")
    if layers != config["num_hidden_layers"]:
        cuts.append(f"{layers} of {config['num_hidden_layers']} layers kept")
        config = {**config, **_layers(layers)}
    cut = f"{name}: {', '.join(cuts)} ({size / 2**30:.1f} GiB of weights fit {budget / 2**30:.1f} GiB)" \
        if cuts else None
    return Shape(name, family, config, cut, found)


def write_shape(shape: Shape, cache_dir: Path) -> Path:
    """``shape`` as a checkpoint directory without weights under ``cache_dir`` (built once; its name
    carries a digest of what it holds). Resource handling: ``demo.build_once``'s."""
    config = {**shape.config, "mtp_num_hidden_layers": 1}
    recipe = json.dumps({"config": config, "tokenizer": _digest(demo.TOKENIZER), "cut": shape.cut,
                         "template": _digest(demo.CHAT_TEMPLATE)}, sort_keys=True)
    target = cache_dir / "shape" / f"{shape.name}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"

    def fill(staging: Path) -> None:
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        eos = config["eos_token_id"]
        (staging / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos]}) + "\n")
        (staging / "tokenizer.json").write_text(covering_tokenizer(int(config["vocab_size"])))
        shutil.copy(demo.CHAT_TEMPLATE, staging / "chat_template.jinja")
        tokens = {"eos_token": f"<{eos}>", "bos_token": None,
                  "model_max_length": config["max_position_embeddings"]}
        (staging / "tokenizer_config.json").write_text(json.dumps(tokens) + "\n")

    return demo.build_once(target, "tokenizer.json", fill)


def covering_tokenizer(vocab: int) -> str:
    """tokenizer.json of the demo's BPE with ``<ID>`` for each id from the demo's size up to
    ``vocab``: text encodes as the demo's, and every id below ``vocab`` decodes."""
    spec = json.loads(demo.TOKENIZER.read_text())
    entries: dict[str, int] = spec["model"]["vocab"]
    taken = set(entries.values()) | {token["id"] for token in spec.get("added_tokens", ())}
    if vocab < len(taken):
        raise ValueError(f"a vocabulary of {vocab} is smaller than the demo tokenizer's {len(taken)}")
    for token_id in range(vocab):
        if token_id not in taken:
            entries[f"<{token_id}>"] = token_id  # printable ASCII: the byte-level decoder keeps it as is
    return json.dumps(spec, ensure_ascii=False)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()

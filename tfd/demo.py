"""The embedded default models: a small Qwen3.5 with an MTP head, and a small Flash Next.

``tfd serve`` or ``tfd generate`` without a model builds one at first use into the cache
directory: a real checkpoint directory (config.json, safetensors, tokenizer.json, chat template,
generation config) loaded like any other. The Qwen3.5 demo's weights ship trained
(``assets/demo_qwen3_5.safetensors``, bf16, with ``demo_qwen3_5.training.json``: ``tfd train-demo``
on Python's standard library sources, a few minutes on an H200), so its MTP head's drafts are
accepted; Flash Next's are drawn from a fixed seed (``tfd.families.random_weights``). Every machine
builds the same bytes; the directory name carries a digest of the recipe and the weights, so a
changed recipe builds anew. The tokenizer is a byte-level BPE
of 4,096 tokens shipped in ``tfd/assets`` (trained by ``train_tokenizer`` on CPython 3.11's
``Lib/*.py``); the chat template is Qwen's ChatML.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch and the model code load only when a demo is built
    import tokenizers
    import torch

ASSETS = Path(__file__).resolve().parent / "assets"
TOKENIZER = ASSETS / "demo_tokenizer.json"
CHAT_TEMPLATE = ASSETS / "chat_template.jinja"
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ENDOFTEXT, IM_END = 0, 2
SEED = 20261129
RECIPE = 2  # bump when a change below must rebuild existing demos
# demos whose weights ship trained (``tfd train-demo`` on the H200; the record beside them says how)
TRAINED = {"qwen3_5": ASSETS / "demo_qwen3_5.safetensors"}
VOCAB = 4096

_ROPE = {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
         "mrope_section": [11, 11, 10], "mrope_interleaved": True}
_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 64,
    "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4, "hidden_act": "silu",
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "rope_parameters": _ROPE, "eos_token_id": ENDOFTEXT, "bos_token_id": None, "pad_token_id": None,
}
DEMOS: Mapping[str, tuple[str, dict[str, Any]]] = {
    "qwen3_5": ("qwen3_5", {
        **_COMMON, "model_type": "qwen3_5_text", "architectures": ["Qwen3_5ForCausalLM"],
        "hidden_size": 256, "num_hidden_layers": 8, "intermediate_size": 768,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2,
        "mtp_num_hidden_layers": 1,
    }),
    "flashnext": ("qwen4_exp", {
        **_COMMON, "model_type": "qwen4_exp_text", "architectures": ["Qwen4ExpForCausalLM"],
        "hidden_size": 128, "num_hidden_layers": 8, "output_gate_type": "sigmoid",
        "layer_types": (["linear_attention"] * 3 + ["indexed_attention"]) * 2,
        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 128, "norm_topk_prob": True, "hc_count": 4, "hc_lowrank": 32,
        "indexer_n_heads": 4, "indexer_kv_heads": 1, "indexer_head_dim": 32, "indexer_budget": 64,
        "indexer_compress_ratio": 4, "ple_layer_ids": [2], "ple_embed_dim": 128, "ple_conv_kernel_size": 4,
        "ngram_size": 3, "heads_per_ngram": 4, "ngram_vocab_size_base": 1009,
        "make_ngram_vocab_size_divisible_by": 64, "seed": 1234, "split_ngram_parts": 1,
        "mtp_num_hidden_layers": 1,
    }),
}


def build_demo(name: str, cache_dir: Path) -> Path:
    """The checkpoint directory of demo ``name``, built first when missing.

    Resource handling: builds in a temporary directory beside the target and renames it into
    place, so a crash leaves no half-built demo and two builders racing both end with one.
    """
    if name not in DEMOS:
        raise ValueError(f"no demo model {name!r}; known: {', '.join(DEMOS)}")
    from safetensors.torch import save_file

    from tfd.families.hybrid import expected_tensors
    from tfd.families.random_weights import random_tensors

    family, config = DEMOS[name]
    tokenizer_bytes = TOKENIZER.read_bytes()
    trained = TRAINED.get(name)
    weights = hashlib.sha256(trained.read_bytes()).hexdigest() if trained is not None else None
    recipe = json.dumps({"recipe": RECIPE, "seed": SEED, "config": config,
                         "tokenizer": hashlib.sha256(tokenizer_bytes).hexdigest(),
                         "template": CHAT_TEMPLATE.read_text(), "weights": weights}, sort_keys=True)
    target = cache_dir / "demo" / f"{name}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"

    def fill(staging: Path) -> None:
        if trained is not None:
            shutil.copy(trained, staging / "model.safetensors")
            shutil.copy(trained.with_suffix(".training.json"), staging / "training.json")
        else:
            _, _, shapes = expected_tensors(family, config, {"mtp.head"})
            save_file(random_tensors(shapes, SEED), staging / "model.safetensors")
        write_files(staging, config)

    return build_once(target, "model.safetensors", fill)


def build_once(target: Path, marker: str, fill: Callable[[Path], None]) -> Path:
    """``target``, a directory that is whole once its file ``marker`` is there, built by ``fill``
    in a temporary directory beside it and renamed into place when missing.

    Resource handling: a crash leaves no half-built directory (the temporary one is removed on
    every path), and two builders racing both end with one; a rename that fails while no other
    builder won is raised.
    """
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        fill(staging)
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / marker).is_file():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def write_files(directory: Path, config: Mapping[str, Any]) -> None:
    """Everything of a demo checkpoint but its weights: config.json, the generation config, the
    tokenizer, its config and the chat template (``build_demo``, and ``tfd train-demo``)."""
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"eos_token_id": [IM_END, ENDOFTEXT]}
    (directory / "generation_config.json").write_text(json.dumps(generation) + "\n")
    shutil.copy(TOKENIZER, directory / "tokenizer.json")
    shutil.copy(CHAT_TEMPLATE, directory / "chat_template.jinja")
    tokens = {"eos_token": SPECIAL[IM_END], "bos_token": None,
              "model_max_length": config["max_position_embeddings"]}
    (directory / "tokenizer_config.json").write_text(json.dumps(tokens) + "\n")


def train_tokenizer(files: Sequence[Path], vocab: int = VOCAB) -> tokenizers.Tokenizer:
    """The recipe of ``assets/demo_tokenizer.json``: a byte-level BPE over ``files``."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(SPECIAL), min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train([str(file) for file in files], trainer)
    return tokenizer


def default_dtype(device: torch.device) -> torch.dtype:
    """fp32 on the CPU (the exact reference), bf16 on an accelerator."""
    import torch

    return torch.float32 if device.type == "cpu" else torch.bfloat16

"""A tiny Qwen3.5 checkpoint in block-wise FP8, as Qwen's -FP8 releases store it: which of its
products tfd reads in FP8, and what it refuses to read so.

The checkpoint: transformers' tiny Qwen3.5 (tests/tiny_models.py) with its attention, GDN and MLP
products quantized by ``tfd.model.fp8.quantize_weight`` (the tiny shapes are all partial 128x128
blocks), the rest (embeddings, norms, a GDN layer's b and a rows, the head) left in bf16 as Qwen's
``modules_to_not_convert`` leaves them. Its logits against a dequantized twin, and the contract, are
every family's: tests/families/test_fp8_families.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_models
import torch

from tfd.checkpoint import Checkpoint, CheckpointError
from tfd.families.hybrid import HybridModel, load_model
from tfd.families.naming import Named
from tfd.model.attention import AttentionWeights
from tfd.model.fp8 import Fp8Weight, Joined
from tfd.model.gdn import GdnWeights

KEPT = ["lm_head", "model.embed_tokens", "linear_attn.in_proj_b", "linear_attn.in_proj_a"]
CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
          "weight_block_size": [128, 128], "modules_to_not_convert": KEPT}

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a",
          "out_proj", "gate_proj", "up_proj", "down_proj")  # the trunk's linear layers


def converted(name: str) -> bool:
    module = name.removesuffix(".weight")
    return module.rsplit(".", 1)[-1] in LINEAR and not any(kept in module for kept in KEPT)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The FP8 checkpoint."""
    directory = tmp_path_factory.mktemp("fp8") / "fp8"
    tiny_models.save_fp8(tiny_models.make_model("qwen3_5").to(torch.bfloat16), directory, converted, CONFIG)
    return directory


def loaded(path: Path) -> HybridModel:
    return load_model(Checkpoint.open(path), "cpu", torch.float32, progress=False)


def test_the_products_are_fp8_and_the_kept_rows_stay_float(checkpoint: Path) -> None:
    model = loaded(checkpoint)
    mixers = {type(layer.mixer): layer.mixer for layer in model.weights.layers}
    gdn, attention = mixers[GdnWeights], mixers[AttentionWeights]
    assert isinstance(gdn, GdnWeights) and isinstance(attention, AttentionWeights)
    assert isinstance(gdn.proj, Joined)  # qkv (128 rows: whole blocks) and z in FP8, then b and a as stored
    assert [type(part) for part in gdn.proj.parts] == [Fp8Weight, torch.Tensor]  # qkv|z one, b|a one
    assert isinstance(gdn.out, Fp8Weight) and isinstance(attention.o, Fp8Weight)
    assert isinstance(attention.qkv, Joined)  # q, k, v each its own blocks (64 rows: partial)
    assert isinstance(model.weights.layers[0].ffn.down, Fp8Weight)
    assert model.weights.head.dtype == torch.float32 and model.weights.embed.dtype == torch.float32


def test_an_fp8_tensor_asked_for_as_a_plain_one_is_refused_naming_it() -> None:
    # a layer whose products tfd does not take in FP8 yet (experts, the MTP head, Flash Next's own)
    held = {"x.weight": torch.ones(4, 4).to(torch.float8_e4m3fn), "x.weight_scale_inv": torch.ones(1, 1)}
    get = Named(held.__getitem__)
    assert isinstance(get.linear("x.weight"), Fp8Weight)
    with pytest.raises(CheckpointError, match=r"x\.weight: stored in FP8"):
        get("x.weight")

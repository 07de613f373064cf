"""Random weights in a config's shapes: the benchmarks' models, and the demo's."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from tfd.demo import DEMOS, SEED, build_demo
from tfd.families.hybrid import HybridModel
from tfd.model.fp8 import Fp8Weight, holds_fp8, quantize_weight


def test_random_weights_are_the_demo_weights(tmp_path: Path) -> None:
    family, config = DEMOS["flashnext"]  # the Qwen3.5 demo ships trained weights
    model = HybridModel.random(family, config, seed=SEED, dtype=torch.float32, head=True)
    stored = load_file(build_demo("flashnext", tmp_path) / "model.safetensors")
    assert torch.equal(model.weights.embed, stored["model.embed_tokens.weight"])
    assert model.head is not None
    assert torch.equal(model.head.fc_embed, stored["mtp.fc_embedding.weight"])  # type: ignore[arg-type]


def test_each_tensor_is_drawn_on_its_own() -> None:
    family, config = DEMOS["flashnext"]
    one = HybridModel.random(family, config, seed=1, dtype=torch.float32)
    other = HybridModel.random(family, config, seed=1, dtype=torch.float32, head=True)
    again = HybridModel.random(family, config, seed=2, dtype=torch.float32)
    assert torch.equal(one.weights.embed, other.weights.embed)  # drawing the head changed nothing else
    assert not torch.equal(one.weights.embed, again.weights.embed)
    assert one.head is None and other.head is not None


def test_random_fp8_weights_are_the_float_draws_quantized_where_releases_have_fp8() -> None:
    family, config = DEMOS["flashnext"]
    plain = HybridModel.random(family, config, seed=3, dtype=torch.float32, head=True)
    fp8 = HybridModel.random(family, config, seed=3, dtype=torch.float32, head=True, fp8=True)
    assert holds_fp8(fp8.weights) and fp8.head is not None and holds_fp8(fp8.head)
    assert not holds_fp8(plain.weights)
    down = fp8.weights.layers[0].ffn.shared.down
    assert isinstance(down, Fp8Weight)  # the same draw, quantized: its real values within e4m3's step
    expected = plain.weights.layers[0].ffn.shared.down
    assert torch.equal(down.dequantized(), quantize_weight(expected).dequantized())  # type: ignore[arg-type]
    assert isinstance(fp8.weights.layers[0].ffn.router, torch.Tensor)  # kept in float, as releases keep it
    assert torch.equal(fp8.weights.embed, plain.weights.embed)

"""Random weights in a config's shapes: the benchmarks' models, and the demo's."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from tfd.demo import DEMOS, SEED, build_demo
from tfd.families.hybrid import HybridModel


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

"""A tiny Qwen3.5 checkpoint in block-wise FP8, as Qwen's -FP8 releases store it, served on the CPU.

The checkpoint: transformers' tiny Qwen3.5 (tests/tiny_models.py) with its attention, GDN and MLP
products quantized by ``tfd.model.fp8.quantize_weight`` (the tiny shapes are all partial 128x128
blocks), the rest (embeddings, norms, a GDN layer's b and a rows, the head) left in bf16 as Qwen's
``modules_to_not_convert`` leaves them. Its twin holds the same weights dequantized, in fp32. tfd's
FP8 products quantize the activations per token too, so the two models' logits differ by that alone
(bounded below); the contract (a lane alone and beside others, resumed and fresh) holds to the bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_models
import torch
from reference_loop import LanePool

from tfd.bench.workload import drive
from tfd.checkpoint import Checkpoint, CheckpointError
from tfd.engine.local_runner import runner_for
from tfd.engine.request import Request, Sampling
from tfd.families.hybrid import HybridModel, load_model
from tfd.families.naming import Named
from tfd.model import fp8
from tfd.model.attention import AttentionWeights
from tfd.model.fp8 import Fp8Weight, Joined
from tfd.model.gdn import GdnWeights
from tfd.model.memory import Span

KEPT = ["lm_head", "model.embed_tokens", "linear_attn.in_proj_b", "linear_attn.in_proj_a"]
CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
          "weight_block_size": [128, 128], "modules_to_not_convert": KEPT}
PROMPT = tuple(range(3, 43))
# activations rounded to e4m3 (3 mantissa bits: 2^-4 relative at most) in every product of 4 random
# layers, one scale a row here (hidden 64 < a group of 128): measured 0.18 of the logits' RMS
LOGITS_RMS = 0.25


LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a",
          "out_proj", "gate_proj", "up_proj", "down_proj")  # the trunk's linear layers


def converted(name: str) -> bool:
    module = name.removesuffix(".weight")
    return module.rsplit(".", 1)[-1] in LINEAR and not any(kept in module for kept in KEPT)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The FP8 checkpoint and its dequantized twin."""
    root = tmp_path_factory.mktemp("fp8")
    model = tiny_models.make_model("qwen3_5").to(torch.bfloat16)
    fp8_dir, twin_dir = root / "fp8", root / "twin"
    quantized = tiny_models.save_fp8(model, fp8_dir, converted, CONFIG)
    twin = {name: quantized[name].dequantized(torch.float32) if name in quantized else value.float()
            for name, value in model.state_dict().items()}
    tiny_models.save_with(model, twin_dir, twin)
    return fp8_dir, twin_dir


def loaded(path: Path) -> HybridModel:
    return load_model(Checkpoint.open(path), "cpu", torch.float32, progress=False)


def prompt_logits(model: HybridModel) -> torch.Tensor:
    lanes = LanePool(model, len(PROMPT))
    hidden = lanes.forward([Span(lanes.open(), 0, torch.tensor(PROMPT))]).hidden
    return model.logits(hidden)


def test_the_products_are_fp8_and_the_kept_rows_stay_float(checkpoints: tuple[Path, Path]) -> None:
    model = loaded(checkpoints[0])
    mixers = {type(layer.mixer): layer.mixer for layer in model.weights.layers}
    gdn, attention = mixers[GdnWeights], mixers[AttentionWeights]
    assert isinstance(gdn, GdnWeights) and isinstance(attention, AttentionWeights)
    assert isinstance(gdn.proj, Joined)  # qkv (128 rows: whole blocks) and z in FP8, then b and a as stored
    assert [type(part) for part in gdn.proj.parts] == [Fp8Weight, torch.Tensor]  # qkv|z one, b|a one
    assert isinstance(gdn.out, Fp8Weight) and isinstance(attention.o, Fp8Weight)
    assert isinstance(attention.qkv, Joined)  # q, k, v each its own blocks (64 rows: partial)
    assert isinstance(model.weights.layers[0].ffn.down, Fp8Weight)
    assert model.weights.head.dtype == torch.float32 and model.weights.embed.dtype == torch.float32


def test_its_logits_are_the_dequantized_twins_but_for_the_activations_rounding(
        checkpoints: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    twin = prompt_logits(loaded(checkpoints[1]))
    ours = prompt_logits(loaded(checkpoints[0]))
    difference = (ours - twin).pow(2).mean().sqrt() / twin.pow(2).mean().sqrt()
    assert 0 < difference < LOGITS_RMS  # not the twin's bits: its activations are rounded to e4m3
    # with the activations left unrounded, every FP8 product (the blocks, their scales, joined parts
    # side by side, the rows kept in float) is the twin's to fp32's rounding
    monkeypatch.setattr(fp8, "linear", lambda x, w: (x.float() @ w.dequantized().T).to(x.dtype))
    unrounded = prompt_logits(loaded(checkpoints[0]))
    assert (unrounded - twin).abs().max() < 1e-4 * twin.abs().max()


def test_an_fp8_lane_draws_alone_what_it_draws_beside_others(checkpoints: tuple[Path, Path]) -> None:
    model = loaded(checkpoints[0])
    requests = [Request(f"r{i}", tuple(range(5 + i, 30 + 3 * i)), 10, Sampling(temperature=1.0, seed=i))
                for i in range(3)]
    together = drive(model, requests, 64, graphs=False).tokens
    alone = [drive(model, [request], 64, graphs=False).tokens[0] for request in requests]
    assert list(together) == alone


def test_an_fp8_lane_resumed_from_a_kept_state_draws_what_a_fresh_one_does(
        checkpoints: tuple[Path, Path]) -> None:
    model = loaded(checkpoints[0])
    request = Request("kept", tuple(range(5, 75)), 10, Sampling(temperature=1.0, seed=3))
    runner = runner_for(model, len(request.prompt) + 10, 1, graphs=False, kept_states=2)
    first = drive(model, [request], 64, graphs=False, runner=runner)
    again = drive(model, [request], 64, graphs=False, runner=runner)
    fresh = drive(model, [request], 64, graphs=False)
    assert first.cached == (0,) and again.cached[0] > 0
    assert again.tokens == first.tokens == fresh.tokens


def test_an_fp8_tensor_asked_for_as_a_plain_one_is_refused_naming_it() -> None:
    # a layer whose products tfd does not take in FP8 yet (experts, the MTP head, Flash Next's own)
    held = {"x.weight": torch.ones(4, 4).to(torch.float8_e4m3fn), "x.weight_scale_inv": torch.ones(1, 1)}
    get = Named(held.__getitem__)
    assert isinstance(get.linear("x.weight"), Fp8Weight)
    with pytest.raises(CheckpointError, match=r"x\.weight: stored in FP8"):
        get("x.weight")

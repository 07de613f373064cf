"""Every family's tiny checkpoint in block-wise FP8, served on the CPU: its twin, the contract, transformers.

A family's checkpoint (tests/tiny_models.py, with an MTP head) is copied with every linear weight,
the fused experts and the MTP head's products in FP8 (``tiny_models.fp8_copy``), and what a release
keeps in bf16 left so: embeddings, the head, the router and shared gate, a GDN layer's b and a rows.
Its twin holds the same weights dequantized, in fp32. tfd's FP8 products also round the activations
to e4m3 per row and 128-wide group, so the two differ by that alone; with that rounding taken out
they agree to fp32's rounding, which checks every FP8 weight's reading (blocks, scales, regrouped rows,
joined parts, stacked experts) in every family. The contract holds to the bit within the FP8 model.
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
from tfd.engine.runner import Drafting
from tfd.families.hybrid import HybridModel, load_model
from tfd.model import fp8
from tfd.model.fp8 import Fp8Experts, Joined, Rows, holds_fp8
from tfd.model.memory import Span
from tfd.model.mlp import MoeWeights
from tfd.quantization import BlockFp8

KEPT = ["lm_head", "embed_tokens", "ngram_embedding", "mlp.gate", "mlp.shared_expert_gate", "in_proj_b",
        "in_proj_a", "in_proj_ba"]
CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
          "weight_block_size": [128, 128], "modules_to_not_convert": KEPT}
PROMPT = tuple(range(3, 43))
# activations rounded to e4m3 (3 mantissa bits: 2^-4 relative at most) in every product of a few random
# layers, a scale a row and group: measured 0.06-0.14 of the logits' RMS over the four families
LOGITS_RMS = 0.25
UNROUNDED = 1e-4  # max |FP8 - twin| / max |twin| with the activations unrounded: fp32's rounding alone


def converted(name: str) -> bool:
    """A linear layer's weight or fused experts, not kept in bf16 by ``KEPT`` (transformers' rule)."""
    if name.endswith((".experts.gate_up_proj", ".experts.down_proj")):
        return BlockFp8(tuple(KEPT)).converted(name.rsplit(".", 1)[0])
    return name.endswith(".weight") and BlockFp8(tuple(KEPT)).converted(name.removesuffix(".weight")) \
        and not name.endswith("conv1d.weight") and ".ngram_embedding." not in name  # the table, its shards


@pytest.fixture(scope="module", params=tiny_models.FAMILIES)
def checkpoints(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                ) -> tuple[Path, Path]:
    """A family's FP8 checkpoint (with an MTP head) and its dequantized twin."""
    family = request.param
    root = tmp_path_factory.mktemp(f"fp8-{family}")
    source = tiny_models.save(family, root / "source", head=True)
    twin = tiny_models.fp8_copy(source, root / "fp8", converted, CONFIG)
    import shutil

    import safetensors.torch

    shutil.copytree(source, root / "twin")
    safetensors.torch.save_file(twin, root / "twin" / "model.safetensors", metadata={"format": "pt"})
    return root / "fp8", root / "twin"


def loaded(path: Path) -> HybridModel:
    return load_model(Checkpoint.open(path), "cpu", torch.float32, progress=False)


def prompt_logits(model: HybridModel) -> torch.Tensor:
    lanes = LanePool(model, len(PROMPT))
    hidden = lanes.forward([Span(lanes.open(), 0, torch.tensor(PROMPT))]).hidden
    return model.logits(hidden)


def test_every_product_but_the_kept_ones_is_fp8(checkpoints: tuple[Path, Path]) -> None:
    model = loaded(checkpoints[0])
    for layer in model.weights.layers:
        assert holds_fp8(layer.mixer) and holds_fp8(layer.ffn), layer.name
        if isinstance(layer.ffn, MoeWeights):
            assert isinstance(layer.ffn.gate_up, Fp8Experts) and isinstance(layer.ffn.down, Fp8Experts)
            assert isinstance(layer.ffn.router, torch.Tensor)  # kept in bf16, as releases keep it
    assert model.head is not None and holds_fp8(model.head)  # the MTP head's fc and its layer
    assert model.weights.head.dtype == torch.float32 and model.weights.embed.dtype == torch.float32
    if model.cfg.family == "qwen3_next":  # in_proj_qkvz's rows regrouped after the product
        gdn = next(layer.mixer for layer in model.weights.layers if hasattr(layer.mixer, "proj"))
        assert isinstance(gdn.proj, Joined) and isinstance(gdn.proj.parts[0], Rows)


def test_its_logits_are_the_twins_but_for_the_activations_rounding(
        checkpoints: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    twin = prompt_logits(loaded(checkpoints[1]))
    ours = prompt_logits(loaded(checkpoints[0]))
    difference = (ours - twin).pow(2).mean().sqrt() / twin.pow(2).mean().sqrt()
    assert 0 < difference < LOGITS_RMS
    monkeypatch.setattr(fp8, "linear", lambda x, w: (x.float() @ w.dequantized().T).to(x.dtype))
    unrounded = prompt_logits(loaded(checkpoints[0]))
    assert (unrounded - twin).abs().max() < UNROUNDED * twin.abs().max()


def test_a_lane_draws_alone_beside_others_and_drafted_what_it_draws_plainly(
        checkpoints: tuple[Path, Path]) -> None:
    model = loaded(checkpoints[0])
    requests = [Request(f"r{i}", tuple(range(5 + i, 30 + 3 * i)), 10, Sampling(temperature=1.0, seed=i))
                for i in range(3)]
    together = drive(model, requests, 64, graphs=False).tokens
    alone = [drive(model, [request], 64, graphs=False).tokens[0] for request in requests]
    drafted = drive(model, requests, 64, graphs=False, drafting=Drafting(2, 0.0))
    assert drafted.drafts.accepted > 0  # the FP8 MTP head's drafts were verified, and some taken
    assert list(together) == alone == list(drafted.tokens)


def test_a_lane_resumed_from_a_kept_state_draws_what_a_fresh_one_does(checkpoints: tuple[Path, Path]) -> None:
    model = loaded(checkpoints[0])
    request = Request("kept", tuple(range(5, 75)), 10, Sampling(temperature=1.0, seed=3))
    runner = runner_for(model, len(request.prompt) + 10, 1, graphs=False, kept_states=2)
    first = drive(model, [request], 64, graphs=False, runner=runner)
    again = drive(model, [request], 64, graphs=False, runner=runner)
    fresh = drive(model, [request], 64, graphs=False)
    assert first.cached == (0,) and again.cached[0] > 0
    assert again.tokens == first.tokens == fresh.tokens


def test_experts_stored_one_by_one_stack_as_the_fused_ones_where_their_blocks_line_up(tmp_path: Path) -> None:
    # gate and up rows of 128 (whole blocks): the experts one by one quantize to the fused tensor's blocks
    source = tiny_models.save("qwen3_5_moe", tmp_path, expert_inner=128)
    tiny_models.fp8_copy(source, tmp_path / "fused", converted, CONFIG)
    tiny_models.fp8_copy(source, tmp_path / "apart", converted, CONFIG, fuse=False)
    fused, apart = loaded(tmp_path / "fused"), loaded(tmp_path / "apart")
    assert isinstance(apart.weights.layers[0].ffn, MoeWeights)
    assert isinstance(apart.weights.layers[0].ffn.gate_up, Fp8Experts)
    assert torch.equal(prompt_logits(fused), prompt_logits(apart))


def test_experts_one_by_one_whose_blocks_do_not_line_up_are_refused_naming_them(tmp_path: Path) -> None:
    source = tiny_models.save("qwen3_5_moe", tmp_path)  # gate rows of 32: a partial block each
    tiny_models.fp8_copy(source, tmp_path / "apart", converted, CONFIG, fuse=False)
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mlp\.experts: an expert's gate rows \(32\) "
                                              r"are not whole 128-row blocks"):
        loaded(tmp_path / "apart")

"""A rank's share of a checkpoint (``tfd.families.sharding``), without a process group: what a rank
reads of the files is the in-memory share of the whole, the ranks' shares joined give the whole back,
a rank's config holds its share of every count, and what does not split is refused by name on either
side of the threshold (a count the size divides, one it does not; FP8 weights)."""

from __future__ import annotations

from pathlib import Path

import pytest
import safetensors.torch
import tiny_models
import torch

from support import CACHE
from tfd.checkpoint import Checkpoint, CheckpointError
from tfd.families.hybrid import HybridModel, expected_tensors, load_model
from tfd.families.random_weights import random_tensors
from tfd.families.sharding import rank_config, refusals
from tfd.model.attention import AttentionWeights
from tfd.model.fp8 import Fp8Weight
from tfd.model.gdn import GdnWeights
from tfd.model.mlp import MoeWeights
from tfd.model.parallel import Parallel


def checkpoint(family: str) -> Path:
    return tiny_models.save(family, CACHE / "tiny-plain", head=True)


def whole_tensors(path: Path) -> dict[str, torch.Tensor]:
    return {name: tensor for file in sorted(path.glob("*.safetensors"))
            for name, tensor in safetensors.torch.load_file(file).items()}


def weights(model: HybridModel) -> list[torch.Tensor]:
    """Every tensor a model's layers multiply by, in order."""
    found = []
    for layer in model.weights.layers:
        mixer, ffn = layer.mixer, layer.ffn
        if isinstance(mixer, GdnWeights):
            found += [mixer.proj, mixer.conv, mixer.a_log, mixer.dt_bias, mixer.out]
        else:
            assert isinstance(mixer, AttentionWeights)
            found += [mixer.qkv, mixer.o]
        if isinstance(ffn, MoeWeights):
            found += [ffn.router, ffn.gate_up, ffn.down, ffn.shared.gate_up, ffn.shared.down]
        else:
            found += [ffn.gate_up, ffn.down]
    assert all(isinstance(tensor, torch.Tensor) for tensor in found)
    return found  # type: ignore[return-value]


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen4_exp"])
def test_a_ranks_reads_are_its_share_of_the_whole_and_the_shares_join_to_it(family: str) -> None:
    path = checkpoint(family)
    opened = Checkpoint.open(path)
    full = load_model(opened, "cpu", torch.float32, progress=False)
    ranks = [load_model(opened, "cpu", torch.float32, progress=False, parallel=Parallel(rank, 2))
             for rank in range(2)]
    for rank, model in enumerate(ranks):  # read in slices from the files == cut from the tensors in memory
        cut = HybridModel.from_tensors(family, opened.text_config, whole_tensors(path),
                                     parallel=Parallel(rank, 2))
        assert all(torch.equal(a, b) for a, b in zip(weights(model), weights(cut), strict=True))
        assert model.cfg == rank_config(full.cfg, Parallel(rank, 2))
        assert model.weights.parallel == Parallel(rank, 2)
    layer = next(i for i, found in enumerate(full.weights.layers)
                 if isinstance(found.mixer, AttentionWeights))
    mixers = [model.weights.layers[layer].mixer for model in (full, *ranks)]
    assert all(isinstance(mixer, AttentionWeights) for mixer in mixers)
    # o's columns are the heads' outputs: the two ranks' columns side by side are the whole
    assert torch.equal(torch.cat([mixers[1].o, mixers[2].o], dim=1), mixers[0].o)  # type: ignore[union-attr]
    assert mixers[1].qkv.shape[0] * 2 == mixers[0].qkv.shape[0]  # type: ignore[union-attr]
    assert full.weights.parallel is None


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_a_ranks_random_weights_are_its_share_of_the_whole_draw(family: str) -> None:
    """A shape drawn by a rank (``tfd bench --tensor-parallel``, ``tfd serve --shape``) is what one
    process draws, cut: each tensor drawn whole by its name's generator, then shared."""
    text = Checkpoint.open(checkpoint(family)).text_config
    _, _, shapes = expected_tensors(family, text, set())
    whole = random_tensors(shapes, 3, torch.float32)
    for rank in range(2):
        drawn = HybridModel.random(family, text, seed=3, dtype=torch.float32, parallel=Parallel(rank, 2))
        cut = HybridModel.from_tensors(family, text, whole, parallel=Parallel(rank, 2))
        assert all(torch.equal(a, b) for a, b in zip(weights(drawn), weights(cut), strict=True))
        assert drawn.cfg.heads * 2 == HybridModel.random(family, text, seed=3).cfg.heads


def test_a_ranks_config_is_its_share_of_every_count() -> None:
    full = load_model(Checkpoint.open(checkpoint("qwen3_5_moe")), "cpu", torch.float32, progress=False).cfg
    half = rank_config(full, Parallel(0, 2))
    assert (half.heads, half.kv_heads, half.key_heads, half.value_heads) == \
        (full.heads // 2, full.kv_heads // 2, full.key_heads // 2, full.value_heads // 2)
    assert (half.expert_inner, half.shared_inner, half.experts) == \
        (full.expert_inner // 2, full.shared_inner // 2, full.experts)  # experts whole, each split
    assert (half.hidden, half.head_dim, half.vocab) == (full.hidden, full.head_dim, full.vocab)


def test_only_the_counts_a_size_does_not_divide_are_named() -> None:
    cfg = load_model(Checkpoint.open(checkpoint("qwen3_5")), "cpu", torch.float32, progress=False).cfg
    assert (cfg.heads, cfg.kv_heads, cfg.key_heads, cfg.value_heads, cfg.intermediate) == (4, 2, 2, 4, 96)
    assert refusals(cfg, 1) == [] and refusals(cfg, 2) == []
    assert refusals(cfg, 4) == [
        "TF_TENSOR_PARALLEL=4: the 2 key-value heads (num_key_value_heads) do not split into 4",
        "TF_TENSOR_PARALLEL=4: the 2 GDN key heads (linear_num_key_heads) do not split into 4"]
    three = refusals(cfg, 3)
    assert three[0] == "TF_TENSOR_PARALLEL=3: the 4 attention heads (num_attention_heads) do not split into 3"
    assert len(three) == 4  # 96 inner columns do split into 3


def test_an_fp8_weight_splits_with_its_scales_in_whole_blocks_or_is_refused_by_name() -> None:
    unaligned = Checkpoint.open(tiny_models.save_released_fp8("qwen3_5", CACHE))
    with pytest.raises(CheckpointError, match=r"self_attn\.k_proj\.weight \[64, 64\] is FP8 and splits into "
                                              r"shares of 32 along dimension 0, not whole 128-wide"):
        load_model(unaligned, "cpu", torch.float32, progress=False, parallel=Parallel(0, 2))
    assert load_model(unaligned, "cpu", torch.float32, progress=False, parallel=Parallel(0, 1)).cfg.heads == 4
    opened = Checkpoint.open(tiny_models.save_released_fp8("qwen3_5", CACHE, aligned=True))

    def o_of(model: HybridModel) -> Fp8Weight:
        found = next(layer.mixer for layer in model.weights.layers
                     if isinstance(layer.mixer, AttentionWeights))
        assert isinstance(found.o, Fp8Weight)
        return found.o

    whole = o_of(load_model(opened, "cpu", torch.float32, progress=False))
    assert whole.data.shape == (64, 512) and whole.scale_inv.shape == (1, 4)
    for rank in range(2):  # the rank's 256 columns of o (its 2 heads of 128) and their 2 scale blocks
        o = o_of(load_model(opened, "cpu", torch.float32, progress=False, parallel=Parallel(rank, 2)))
        columns = slice(rank * 256, (rank + 1) * 256)
        assert torch.equal(o.data.view(torch.uint8), whole.data[:, columns].view(torch.uint8))
        assert torch.equal(o.scale_inv, whole.scale_inv[:, rank * 2:(rank + 1) * 2])


def test_under_expert_parallel_a_rank_holds_a_share_of_the_experts_whole() -> None:
    path = checkpoint("qwen3_5_moe")
    opened = Checkpoint.open(path)
    full = load_model(opened, "cpu", torch.float32, progress=False)
    assert full.cfg.experts == 8 and refusals(full.cfg, 2, experts=True) == []
    assert refusals(full.cfg, 3, experts=True)[:1] == [
        "TF_TENSOR_PARALLEL=3: the 4 attention heads (num_attention_heads) do not split into 3"]
    assert "TF_TENSOR_PARALLEL=3: the 8 routed experts (num_experts) do not split into 3" in \
        refusals(full.cfg, 3, experts=True)
    whole = next(layer.ffn for layer in full.weights.layers if isinstance(layer.ffn, MoeWeights))
    for rank in range(2):
        parallel = Parallel(rank, 2, experts=True)
        model = load_model(opened, "cpu", torch.float32, progress=False, parallel=parallel)
        cut = HybridModel.from_tensors("qwen3_5_moe", opened.text_config, whole_tensors(path),
                                       parallel=parallel)
        assert model.cfg.held_experts == (4 * rank, 4 * rank + 4)
        assert model.cfg.expert_inner == full.cfg.expert_inner  # each expert whole
        ffn = next(layer.ffn for layer in model.weights.layers if isinstance(layer.ffn, MoeWeights))
        assert ffn.first_expert == 4 * rank and isinstance(ffn.gate_up, torch.Tensor)
        assert torch.equal(ffn.gate_up, whole.gate_up[4 * rank:4 * rank + 4])  # type: ignore[index]
        assert all(torch.equal(a, b) for a, b in zip(weights(model), weights(cut), strict=True))

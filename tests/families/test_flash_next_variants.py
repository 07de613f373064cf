"""Flash Next's config past the tiny checkpoint's values, each against transformers: where the
model's behaviour changes, both sides.

The tiny checkpoint has 4 residual streams, PLE on its second layer, bigram and trigram heads and
its table in one part. Here: 2 streams (the least, ``hc_count > 1``); PLE on the first layer; n-grams
of 2 (bigram heads alone, a history of one token, dilation 2) and of 4 (a history of three, dilation
4); the table written in 4 parts (joined at load). Each gives transformers' prompt logits and greedy
tokens, and its batched decode the span path's tokens. Two PLE layers, which no released config
has (a lane keeps one PLE tail), are refused at load by name.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_models
import torch
from reference_loop import LanePool, greedy

from tfd.bench.workload import drive
from tfd.checkpoint import Checkpoint
from tfd.engine.request import Request, Sampling
from tfd.families.config import ConfigError
from tfd.families.hybrid import HybridModel, load_model
from tfd.model.memory import Span

VARIANTS = {
    "two-streams": {"hc_count": 2},
    "ple-on-the-first-layer": {"ple_layer_ids": [1]},  # one-indexed, as transformers counts
    "bigrams": {"ngram_size": 2},
    "four-grams": {"ngram_size": 4, "ple_embed_dim": 48},  # its 6 hash heads must divide the embedding
    "table-in-4-parts": {"split_ngram_parts": 4},
}
PROMPT = 96
NEW = 8
TOLERANCE = 1e-4


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[str, torch.nn.Module, HybridModel, Path]:
    flash = VARIANTS[str(request.param)]
    path = tiny_models.save("qwen4_exp", tmp_path_factory.mktemp("variant"), flash=flash)
    reference = tiny_models.make_model("qwen4_exp", flash=flash)
    reference.generation_config.eos_token_id = None  # compare every token, EOS or not
    return str(request.param), reference, load_model(Checkpoint.open(path), dtype=torch.float32,
                                                     progress=False), path


def prompt_ids(length: int = PROMPT) -> torch.Tensor:
    ids = torch.randint(8, tiny_models.VOCAB, (length,), generator=torch.Generator().manual_seed(3))
    ids[[20, 21, length - 9]] = tiny_models.EOS  # the n-gram context stops after an EOS, twice in a row once
    return ids


def test_the_variant_is_what_it_says(variant: tuple[str, torch.nn.Module, HybridModel, Path]) -> None:
    name, _, model, path = variant
    ple = [layer.ple for layer in model.weights.layers if layer.ple is not None]
    found = {"two-streams": model.weights.streams == 2,
             "ple-on-the-first-layer": len(ple) == 1 and model.weights.layers[0].ple is not None,
             "bigrams": len(ple[0].multipliers) == 2, "four-grams": len(ple[0].multipliers) == 4,
             "table-in-4-parts": sum(".ngram_embedding.shard_" in name
                                     for name in Checkpoint.open(path).tensors) == 4}
    assert found[name]


def test_prompt_logits_and_greedy_tokens_are_transformers(
        variant: tuple[str, torch.nn.Module, HybridModel, Path]) -> None:
    _, reference, model, _ = variant
    ids = prompt_ids()
    with torch.no_grad():
        expected = reference(ids[None]).logits[0]
        tokens = reference.generate(ids[None], max_new_tokens=NEW, do_sample=False)[0, PROMPT:].tolist()
    lanes = LanePool(model, PROMPT)
    hidden = lanes.forward([Span(lanes.open(), 0, ids)]).hidden
    ours = model.logits(hidden)
    assert float((ours - expected).abs().max() / expected.abs().max()) < TOLERANCE
    assert greedy(model, ids.tolist(), NEW).tokens == tokens


def test_batched_decode_continues_as_the_span_path(variant: tuple[str, torch.nn.Module, HybridModel, Path]
                                                    ) -> None:
    _, _, model, _ = variant
    asked = [Request(f"r{i}", tuple(prompt_ids(40 + 31 * i).tolist()), NEW, Sampling(0.0))
             for i in range(2)]
    batched = drive(model, asked, 256, graphs=False).tokens
    spanned = [greedy(model, list(request.prompt), NEW).tokens for request in asked]
    assert spanned == [list(tokens) for tokens in batched]


def test_two_ple_layers_are_refused_by_name(tmp_path: Path) -> None:
    path = tiny_models.save("qwen4_exp", tmp_path, flash={"ple_layer_ids": [2, 3]})
    with pytest.raises(ConfigError, match=r"ple_layer_ids \[2, 3\]: tfd serves one PLE layer"):
        load_model(Checkpoint.open(path), dtype=torch.float32, progress=False)

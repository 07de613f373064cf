"""Flash Next's QSA past its budget against transformers' own indexer, on tiny random checkpoints.

For every QSA budget {8, 16, 32} and compress ratio {2, 4}: the prompt's logits at every position
(contexts below, at and well past the budget, with and without an open tail), then greedy decoding
from a prompt just under the budget (its steps cross the budget and complete blocks) and from one
well past it, with every step's logits. Each case first checks that the budget matters: the
reference with a budget covering the context gives other logits, so a selection that kept
everything (or the wrong blocks) could not pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tiny_models
import torch
from reference_loop import LanePool, greedy

from tfd.checkpoint import Checkpoint
from tfd.families.hybrid import HybridModel, load_model
from tfd.model.memory import Span

PAIRS = [(8, 2), (8, 4), (16, 2), (16, 4), (32, 2), (32, 4)]  # (budget, compress ratio)
STEPS = 8
TOLERANCE = 1e-4  # max |ours - reference| / max |reference|


@pytest.fixture(scope="module", params=PAIRS, ids=[f"budget{b}-ratio{r}" for b, r in PAIRS])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[int, int, torch.nn.Module, HybridModel]]:
    budget, ratio = request.param
    path = tiny_models.save("qwen4_exp", tmp_path_factory.mktemp("qsa"), budget=budget, compress=ratio)
    reference = tiny_models.make_model("qwen4_exp", budget=budget, compress=ratio)
    reference.generation_config.eos_token_id = None  # every step compared, EOS or not
    assert reference.config.indexer_budget == budget and reference.config.indexer_compress_ratio == ratio
    model = load_model(Checkpoint.open(Path(path)), dtype=torch.float32, progress=False)
    yield budget, ratio, reference, model


def ids_of(length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, tiny_models.VOCAB, (length,), generator=torch.Generator().manual_seed(seed))


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours - reference).abs().max() / reference.abs().max())


def dense_logits(reference: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The reference's logits with every indexer keeping every complete block (dense attention)."""
    indexers = [m for m in reference.modules() if type(m).__name__ == "Qwen4ExpTextQSAIndexer"]
    kept = [(m.token_budget, m.block_topk) for m in indexers]
    try:
        for m in indexers:
            m.block_topk = ids.shape[0]
            m.token_budget = m.block_topk * m.compress_ratio
        with torch.no_grad():
            return reference(ids[None]).logits[0]
    finally:
        for m, (budget, blocks) in zip(indexers, kept, strict=True):
            m.token_budget, m.block_topk = budget, blocks


def test_prompt_logits_below_at_and_past_the_budget(
        pair: tuple[int, int, torch.nn.Module, HybridModel]) -> None:
    budget, ratio, reference, model = pair
    length = 2 * budget + ratio + 1  # an open tail at the end; every position a context length
    ids = ids_of(length, seed=budget + ratio)
    with torch.no_grad():
        expected = reference(ids[None]).logits[0]
    past = budget + ratio - 1  # the first query that can lose a block: its context is budget + ratio
    dense = dense_logits(reference, ids)
    # before it the budget changes nothing but the reference's own rounding (its attention's masks differ
    # in shape, and the CPU's products may round by them: a few ulps here and there on some hosts)
    assert relative_error(dense[:past], expected[:past]) < 1e-6
    assert relative_error(dense[past:], expected[past:]) > 1e-3  # the budget matters here

    lanes = LanePool(model, length)
    ours = model.logits(lanes.forward([Span(lanes.open(), 0, ids)]).hidden)
    errors = (ours - expected).abs().amax(dim=-1) / expected.abs().max()
    assert errors.max() < TOLERANCE, f"first position off: {int((errors >= TOLERANCE).nonzero()[0])}"
    assert ours.argmax(dim=-1).tolist() == expected.argmax(dim=-1).tolist()


@pytest.mark.parametrize("where", ["under", "past"])
def test_greedy_decode_across_and_past_the_budget(pair: tuple[int, int, torch.nn.Module, HybridModel],
                                                  where: str) -> None:
    budget, ratio, reference, model = pair
    length = budget - 2 if where == "under" else 2 * budget + 1
    ids = ids_of(length, seed=3 * budget + ratio)
    with torch.no_grad():
        out = reference.generate(ids[None], max_new_tokens=STEPS, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True)
    expected_tokens = out.sequences[0, length:].tolist()
    expected = torch.cat(out.logits)  # [STEPS, vocab]: the prompt's last row, then each decode step's

    lanes = LanePool(model, length + STEPS)
    lane = lanes.open()
    hidden = [lanes.forward([Span(lane, 0, ids)]).hidden[-1:]]
    for step, token in enumerate(expected_tokens[:-1]):
        hidden.append(lanes.forward([Span(lane, length + step, torch.tensor([token]), decode=True)]).hidden)
    ours = model.logits(torch.cat(hidden))
    assert relative_error(ours, expected) < TOLERANCE
    assert ours.argmax(dim=-1).tolist() == expected_tokens
    assert greedy(model, ids.tolist(), STEPS).tokens == expected_tokens

"""Every family against transformers' own modules, on tiny random checkpoints it wrote itself."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import tiny_models
import torch
from reference_loop import LanePool, greedy

from tfd.checkpoint import Checkpoint
from tfd.families.hybrid import HybridModel, load_model
from tfd.model.memory import Span

PROMPT = 300
CONTINUATION = 32
TOLERANCE = 1e-4  # max |ours - reference| / max |reference|, over every logit compared


@pytest.fixture(scope="module", params=tiny_models.FAMILIES)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[str, torch.nn.Module, HybridModel]]:
    name = request.param
    path = tiny_models.save(name, tmp_path_factory.mktemp("tiny"))
    reference = tiny_models.make_model(name)
    model = load_model(Checkpoint.open(path), dtype=torch.float32, progress=False)
    yield name, reference, model


def prompt_ids(length: int = PROMPT) -> torch.Tensor:
    generator = torch.Generator().manual_seed(11)
    ids = torch.randint(0, tiny_models.VOCAB, (length,), generator=generator)
    ids[[40, 41, 150]] = tiny_models.EOS  # PLE's n-gram context stops after an EOS
    return ids


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours - reference).abs().max() / reference.abs().max())


def test_one_pass_prefill_matches(family: tuple[str, torch.nn.Module, HybridModel]) -> None:
    _, reference, model = family
    ids = prompt_ids()
    with torch.no_grad():
        expected = reference(ids[None]).logits[0]
    lanes = LanePool(model, PROMPT)
    hidden = lanes.forward([Span(lanes.open(), 0, ids)]).hidden
    assert relative_error(model.logits(hidden), expected) < TOLERANCE


def test_chunked_prefill_then_decode_matches_and_continues_greedily(
        family: tuple[str, torch.nn.Module, HybridModel]) -> None:
    _, reference, model = family
    ids = prompt_ids()
    reference.generation_config.eos_token_id = None  # compare all 32 tokens, EOS or not
    with torch.no_grad():
        expected = reference.generate(ids[None], max_new_tokens=CONTINUATION, do_sample=False,
                                      return_dict_in_generate=True)
    expected_tokens = expected.sequences[0, PROMPT:].tolist()
    full = torch.cat((ids, torch.tensor(expected_tokens[:-1])))
    with torch.no_grad():
        expected_logits = reference(full[None]).logits[0]

    lanes = LanePool(model, PROMPT + CONTINUATION)
    lane = lanes.open()
    hidden = [lanes.forward([Span(lane, start, ids[start:start + 64])]).hidden
              for start in range(0, PROMPT, 64)]
    for position in range(PROMPT, PROMPT + CONTINUATION - 1):
        step = full[position:position + 1]
        hidden.append(lanes.forward([Span(lane, position, step, decode=True)]).hidden)
    ours = model.logits(torch.cat(hidden))
    assert relative_error(ours, expected_logits) < TOLERANCE
    assert ours[PROMPT - 1:].argmax(dim=-1).tolist() == expected_tokens
    assert greedy(model, ids.tolist(), CONTINUATION).tokens == expected_tokens


def test_prefill_cut_at_chunk_multiples_equals_one_pass_bit_for_bit(
        family: tuple[str, torch.nn.Module, HybridModel]) -> None:
    _, _, model = family
    ids = prompt_ids()
    whole = LanePool(model, PROMPT)
    one_pass = whole.forward([Span(whole.open(), 0, ids)]).hidden
    cut = LanePool(model, PROMPT)
    lane = cut.open()
    pieces = [cut.forward([Span(lane, a, ids[a:b])]).hidden for a, b in ((0, 128), (128, 192), (192, PROMPT))]
    assert torch.equal(torch.cat(pieces), one_pass)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_several_sequences_in_one_call_equal_each_alone_bit_for_bit(
        family: tuple[str, torch.nn.Module, HybridModel], dtype: torch.dtype) -> None:
    _, _, fp32 = family
    model = HybridModel(fp32.cfg, fp32.weights, fp32.head, fp32.dtype) if dtype == torch.float32 else \
        HybridModel.random(fp32.cfg.family, _text_config(fp32), seed=4, dtype=dtype)
    ids = prompt_ids()

    def setup(lanes: LanePool) -> list[Span]:
        """Three lanes at different places: a fresh prompt, a second prefill chunk, a decode."""
        fresh, middle, decoding = lanes.open(), lanes.open(), lanes.open()
        lanes.forward([Span(middle, 0, ids[:64])])
        lanes.forward([Span(decoding, 0, ids[:100])])
        return [Span(fresh, 0, ids[7:77]), Span(middle, 64, ids[64:93]),
                Span(decoding, 100, ids[100:101], decode=True)]

    together = LanePool(model, 200, lanes=3)
    spans = setup(together)
    batched = together.forward(spans).hidden
    alone = LanePool(model, 200, lanes=3)
    solo = torch.cat([alone.forward([span]).hidden for span in setup(alone)])
    assert torch.equal(batched, solo)
    assert torch.equal(together.pool.buffer, alone.pool.buffer)  # every state and row alike


def _text_config(model: HybridModel) -> dict[str, object]:
    """The tiny checkpoint's config.json, for drawing random weights of the same shapes."""
    return tiny_models.make_model(model.cfg.family).config.to_dict()

"""The training forward against tfd's serving forward, and the chunked delta rule against the naive one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from reference_loop import LanePool

from tfd.demo import DEMOS, SEED
from tfd.families.hybrid import HybridModel, expected_tensors
from tfd.families.random_weights import random_tensors
from tfd.model.memory import Span
from tfd.train import delta_rule
from tfd.train.model import TrainModel

CONFIG = DEMOS["qwen3_5"][1]
LENGTH = 100  # past one GDN chunk of 64
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def tensors() -> dict[str, torch.Tensor]:
    """The demo's random weights, every norm, decay rate and bias moved off its init value (the
    init's zeros and ones would hide a norm read as w instead of 1 + w)."""
    _, _, shapes = expected_tensors("qwen3_5", CONFIG, {"mtp.head"})
    drawn = random_tensors(shapes, SEED)
    generator = torch.Generator().manual_seed(1)
    return {name: t + 0.1 * torch.randn(t.shape, generator=generator) if t.ndim == 1 else t
            for name, t in drawn.items()}


def relative(ours: torch.Tensor, expected: torch.Tensor) -> float:
    return float(((ours - expected).abs().max() / expected.abs().max()).detach())


def test_logits_and_draft_logits_equal_the_serving_forward(tensors: dict[str, torch.Tensor]) -> None:
    serving = HybridModel.from_tensors("qwen3_5", CONFIG, tensors)
    ids = torch.randint(0, CONFIG["vocab_size"], (LENGTH,), generator=torch.Generator().manual_seed(2))
    lanes = LanePool(serving, LENGTH, head=True)
    lane = lanes.open()
    main = lanes.forward([Span(lane, 0, ids)])
    with torch.no_grad():
        expected = serving.logits(main.hidden)
        cells = serving.draft([Span(lane, 0, ids[1:])], serving.draft_input(main)[:-1], lanes.rows)
        expected_drafts = serving.logits(cells.hidden)
        out = TrainModel.from_tensors(CONFIG, tensors).forward(ids[None, :-1], ids[None, 1:])
    assert out.draft_logits is not None
    assert relative(out.logits[0], expected[:-1]) < TOLERANCE
    assert relative(out.draft_logits[0], expected_drafts) < TOLERANCE


def test_a_batch_row_equals_the_row_alone(tensors: dict[str, torch.Tensor]) -> None:
    model = TrainModel.from_tensors(CONFIG, tensors)
    ids = torch.randint(0, CONFIG["vocab_size"], (3, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        together = model.forward(ids[:, :-1], ids[:, 1:])
        alone = model.forward(ids[1:2, :-1], ids[1:2, 1:])
    assert together.draft_logits is not None and alone.draft_logits is not None
    assert relative(together.logits[1], alone.logits[0]) < TOLERANCE
    assert relative(together.draft_logits[1], alone.draft_logits[0]) < TOLERANCE


def test_the_weights_are_leaves_named_as_the_checkpoint_names_them(tensors: dict[str, torch.Tensor]) -> None:
    model = TrainModel.from_tensors(CONFIG, tensors)
    assert set(model.params) == set(tensors)
    assert all(t.is_leaf and t.requires_grad and t.dtype == torch.float32 for t in model.params.values())
    saved = model.bf16()
    assert all(t.dtype == torch.bfloat16 for t in saved.values())
    with pytest.raises(ValueError, match=r"tensor mtp\.fc\.weight has shape \(3,\)"):
        TrainModel.from_tensors(CONFIG, {**tensors, "mtp.fc.weight": torch.zeros(3)})


def rule_inputs(batch: int, time: int, heads: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(batch, time, heads, 16, generator=generator, dtype=torch.float64), dim=-1) / 4
    k = F.normalize(torch.randn(batch, time, heads, 16, generator=generator, dtype=torch.float64), dim=-1)
    v = torch.randn(batch, time, heads, 8, generator=generator, dtype=torch.float64)
    g = -2 * torch.rand(batch, time, heads, generator=generator, dtype=torch.float64)
    beta = torch.rand(batch, time, heads, generator=generator, dtype=torch.float64)
    return [x.requires_grad_() for x in (q, k, v, g, beta)]


@pytest.mark.parametrize(("time", "chunk"), [(16, 8), (37, 8), (100, delta_rule.CHUNK)])  # padded last chunks
def test_chunked_delta_rule_equals_the_recurrence_in_values_and_gradients(time: int, chunk: int) -> None:
    inputs = rule_inputs(2, time, 3, seed=time)
    chunked = delta_rule.chunked(*inputs, chunk=chunk)
    naive = delta_rule.naive(*inputs)
    assert torch.allclose(chunked, naive, rtol=1e-10, atol=1e-12)
    weights = torch.randn(naive.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    fast = torch.autograd.grad((chunked * weights).sum(), inputs)
    slow = torch.autograd.grad((naive * weights).sum(), inputs)
    for a, b in zip(fast, slow, strict=True):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-11)


def test_under_bf16_autocast_the_forward_keeps_its_fp32_parts_and_stays_close(
        tensors: dict[str, torch.Tensor]) -> None:
    # the CUDA run's mixed precision, on the CPU: products in bf16, the rule and the masters in fp32
    model = TrainModel.from_tensors(CONFIG, tensors)
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 20), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        exact = model.forward(ids[:, :-1], ids[:, 1:])
    with torch.autocast("cpu", torch.bfloat16):
        mixed = model.forward(ids[:, :-1], ids[:, 1:])
    assert mixed.draft_logits is not None and exact.draft_logits is not None
    assert mixed.logits.dtype == torch.bfloat16
    # bf16 noise: rounding the weights alone to bf16 moves these logits by about 5%
    assert relative(mixed.logits.float(), exact.logits) < 0.1
    assert relative(mixed.draft_logits.float(), exact.draft_logits) < 0.1
    torch.autograd.backward(mixed.logits.float().logsumexp(-1).mean() + mixed.draft_logits.float().mean())
    assert all(t.grad is not None and t.grad.dtype == torch.float32 for t in model.params.values())

"""The contract on the batched decode path: on the CPU (torch references) and on the GPU (Triton
kernels and CUDA graphs).

Requests run through the engine's scheduler and runner (``tfd.bench.workload.drive``, the engine
thread's loop without trio) on tiny checkpoints of every family; all four take the batched decode
path (Flash Next, qwen4_exp, with its streams, PLE and QSA layers: block scores, the sparse kernel).
Every gate compares token ids: concurrent == solo at 1/2/4/8 lanes, graphs == eager, a prompt
prefilled in 64-row chunks == in one pass; and the GPU path against the CPU fp32 reference. On the
GPU two more, Flash Next 80 columns wide (kernels whose blocks a row does not fill) and with two
residual streams.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import tiny_models
import torch
from reference_loop import LanePool, greedy, row_error

from support import CACHE
from tfd.bench.workload import drive
from tfd.checkpoint import Checkpoint
from tfd.engine.request import Request, Sampling
from tfd.families.hybrid import HybridModel, load_model
from tfd.model.memory import Span
from tfd_kernels import pdl

ONE_PASS = 8192
WIDE = 80  # a residual width that does not fill its kernels' power-of-two blocks (Flash Next's is 2,560)


def checkpoint(family: str) -> Checkpoint:
    """``family``, or Flash Next ``qwen4_exp-wide`` (a residual of WIDE columns and 3 query heads a
    KV head, as Flash Next's 2,560 columns and 12 heads fill no power-of-two block) or
    ``qwen4_exp-two-streams`` (the fewest residual streams)."""
    name, _, variant = family.partition("-")
    flash = {"hc_count": 2} if variant == "two-streams" else {"num_attention_heads": 6} if variant else None
    hidden = WIDE if variant == "wide" else 64
    return Checkpoint.open(tiny_models.save(name, CACHE / "tiny-plain", hidden=hidden, flash=flash))


# Flash Next's variants on the GPU alone: on the CPU they run the same torch references as the others
@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen4_exp",
                                        pytest.param("qwen4_exp-wide", marks=pytest.mark.gpu),
                                        pytest.param("qwen4_exp-two-streams", marks=pytest.mark.gpu)])
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def model(family: str, request: pytest.FixtureRequest) -> Iterator[HybridModel]:
    """fp32 on the CPU (the reference arithmetic), bf16 on the GPU."""
    device = str(request.param)
    yield load_model(checkpoint(family), device, torch.float32 if device == "cpu" else torch.bfloat16,
                     progress=False)
    if device == "cuda":
        torch.cuda.empty_cache()


@pytest.fixture(scope="module")
def gpu_model(family: str) -> Iterator[HybridModel]:
    model = load_model(checkpoint(family), "cuda", torch.bfloat16, progress=False)
    yield model
    torch.cuda.empty_cache()


def requests(count: int, max_tokens: int = 24, temperature: float = 1.0) -> list[Request]:
    """Prompts of different lengths (some past a page, some not a chunk multiple), keyed seeds."""
    generator = torch.Generator().manual_seed(count)
    made = []
    for i in range(count):
        prompt = torch.randint(8, tiny_models.VOCAB, (37 + 29 * i,), generator=generator)
        made.append(Request(f"r{i}", tuple(prompt.tolist()), max_tokens, Sampling(temperature, seed=100 + i)))
    return made


def test_concurrent_equals_solo(model: HybridModel) -> None:
    asked = requests(8)
    together = drive(model, asked, ONE_PASS, graphs=True).tokens
    assert all(len(tokens) == 24 for tokens in together)
    for count in (1, 2, 4):
        assert drive(model, asked[:count], ONE_PASS, graphs=True).tokens == together[:count]
    for i in (0, 3, 7):
        assert drive(model, [asked[i]], ONE_PASS, graphs=True).tokens[0] == together[i]


@pytest.mark.gpu
def test_graphs_equal_eager(gpu_model: HybridModel) -> None:
    asked = requests(5)
    assert drive(gpu_model, asked, ONE_PASS, graphs=False).tokens == \
        drive(gpu_model, asked, ONE_PASS, graphs=True).tokens


@pytest.mark.gpu
def test_dependent_launch_changes_no_bits(gpu_model: HybridModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels that start early (programmatic dependent launch) wait for their inputs: the same
    tokens as every kernel launched after the last has finished."""
    asked = requests(5)
    early = drive(gpu_model, asked, ONE_PASS, graphs=True).tokens
    monkeypatch.setattr(pdl, "ENABLED", False)
    assert drive(gpu_model, asked, ONE_PASS, graphs=True).tokens == early


def test_chunked_prefill_equals_one_pass(model: HybridModel) -> None:
    asked = requests(6, max_tokens=12)[3:]  # prompts of 124, 153 and 182 rows
    chunked = drive(model, asked, 64, graphs=True).tokens
    assert chunked == drive(model, asked, ONE_PASS, graphs=True).tokens


def prompt_logits(model: HybridModel, prompt: list[int]) -> torch.Tensor:
    lanes = LanePool(model, len(prompt))
    try:
        lane = lanes.open()
        ids = torch.tensor(prompt, device=model.weights.embed.device)
        return model.logits(lanes.forward([Span(lane, 0, ids)]).hidden).float().cpu()
    finally:
        lanes.close()


@pytest.mark.gpu
def test_gpu_logits_are_within_bf16_of_the_cpu_reference(family: str, gpu_model: HybridModel) -> None:
    """The bound is bf16's own: the CPU reference path run in bf16 errs by 2-3% (mean row relative
    L2) on these tiny random models; the GPU path may err at most 1.5 times that, and under 5%."""
    prompt = list(requests(4)[3].prompt)
    want = prompt_logits(load_model(checkpoint(family), "cpu", torch.float32, progress=False), prompt)
    bf16 = row_error(prompt_logits(load_model(checkpoint(family), "cpu", torch.bfloat16, progress=False),
                                   prompt), want)
    got = row_error(prompt_logits(gpu_model, prompt), want)
    assert got <= min(0.05, 1.5 * bf16), f"GPU bf16 logits err {got:.4f}, CPU bf16 {bf16:.4f}"


@pytest.mark.gpu
def test_gpu_fp32_greedy_equals_the_cpu_reference(family: str) -> None:
    asked = requests(2, max_tokens=256, temperature=0.0)
    cpu = load_model(checkpoint(family), "cpu", torch.float32, progress=False)
    gpu = load_model(checkpoint(family), "cuda", torch.float32, progress=False)
    assert drive(gpu, asked, ONE_PASS, graphs=True).tokens == drive(cpu, asked, ONE_PASS, graphs=False).tokens


def test_batched_decode_continues_as_the_span_path(family: str) -> None:
    """The engine's batched decode (torch references on the CPU) and the span path that the parity
    tests hold to transformers give the same greedy continuation."""
    model = load_model(checkpoint(family), "cpu", torch.float32, progress=False)
    asked = requests(3, max_tokens=32, temperature=0.0)
    batched = drive(model, asked, ONE_PASS, graphs=False).tokens
    assert [greedy(model, list(request.prompt), 32).tokens for request in asked] == [list(t) for t in batched]

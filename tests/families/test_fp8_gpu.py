"""Every family's FP8 checkpoint on the GPU: tfd_kernels.fp8_gemm for the dense products and the MoE
kernels' FP8 experts, in the decode graphs. The contract within the GPU path (a lane alone, beside
others and drafted draws the same tokens), and the GPU path near the CPU's reference (bf16 activations
against fp32: a looser bound than the CPU's twin tests). The checkpoints: tests/tiny_models.py's with
experts (and the shared expert) 128 wide, in Qwen's -FP8 layout (``fp8_copy``, experts one by one)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_models
import torch
from reference_loop import LanePool

from support import CACHE
from tfd.bench.workload import drive
from tfd.checkpoint import Checkpoint
from tfd.engine.request import Request, Sampling
from tfd.engine.runner import Drafting
from tfd.families.hybrid import HybridModel, load_model
from tfd.model.fp8 import holds_fp8
from tfd.model.memory import Span

pytestmark = pytest.mark.gpu
PROMPT = tuple(range(3, 43))
NEAR = 0.05  # RMS of (GPU - CPU) logits over the CPU's: bf16 activations and rounding against fp32


@pytest.fixture(scope="module", params=tiny_models.FAMILIES)
def checkpoint(request: pytest.FixtureRequest) -> Path:
    return tiny_models.save_released_fp8(request.param, CACHE)


def loaded(path: Path, device: str, dtype: torch.dtype) -> HybridModel:
    return load_model(Checkpoint.open(path), device, dtype, progress=False)


def test_on_the_gpu_a_lane_draws_alone_beside_others_and_drafted_what_it_draws_plainly(checkpoint: Path
                                                                                        ) -> None:
    model = loaded(checkpoint, "cuda", torch.bfloat16)
    assert holds_fp8(model.weights)
    requests = [Request(f"r{i}", tuple(range(5 + i, 30 + 3 * i)), 12, Sampling(temperature=1.0, seed=i))
                for i in range(4)]
    together = drive(model, requests, 64, graphs=True).tokens
    alone = [drive(model, [request], 64, graphs=True).tokens[0] for request in requests]
    drafted = drive(model, requests, 64, graphs=True, drafting=Drafting(2, 0.0)).tokens
    assert list(together) == alone == list(drafted)


def test_the_gpus_fp8_logits_are_near_the_cpus(checkpoint: Path) -> None:
    def logits(model: HybridModel) -> torch.Tensor:
        lanes = LanePool(model, len(PROMPT))
        device = model.weights.embed.device
        hidden = lanes.forward([Span(lanes.open(), 0, torch.tensor(PROMPT, device=device))]).hidden
        return model.logits(hidden).float().cpu()

    cpu = logits(loaded(checkpoint, "cpu", torch.float32))
    gpu = logits(loaded(checkpoint, "cuda", torch.bfloat16))
    assert (gpu - cpu).pow(2).mean().sqrt() < NEAR * cpu.pow(2).mean().sqrt()

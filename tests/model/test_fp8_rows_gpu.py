"""On the GPU, decode rows made with their FP8 form beside them (``tfd.model.ops.Fp8Rows``: the norms, the
GDN output norm and SwiGLU's middle write their result quantized for the FP8 product after them) give the
tokens the separate quantize launches gave, in graphs and drafted, with fewer quantize launches. The
tiny checkpoints' 64-wide rows never reach the norms' fused path (whole 128-wide groups a row), so the
model here is a shape's config at small sizes with random FP8 weights (the device has no transformers)."""

from __future__ import annotations

import pytest
import torch

from tfd.bench.workload import drive
from tfd.engine.request import Request, Sampling
from tfd.engine.runner import Drafting
from tfd.families.hybrid import HybridModel
from tfd.model import ops
from tfd.shapes import PRESETS
from tfd_kernels import fp8_gemm

pytestmark = pytest.mark.gpu
SMALL = {"vocab_size": 1024, "eos_token_id": 1000, "hidden_size": 256, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 128, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
         "num_hidden_layers": 4, "layer_types": ["linear_attention"] * 3 + ["full_attention"]}
FAMILIES = {"qwen3_5": ("qwen3_5-9b", {"intermediate_size": 512}),  # a dense MLP: every fused producer
            "qwen3_next": ("qwen3_next-80b-a3b", {"intermediate_size": 512, "num_experts": 8,  # MoE blocks
                                                  "num_experts_per_tok": 2, "moe_intermediate_size": 256,
                                                  "shared_expert_intermediate_size": 256})}


def quantize_launches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one at each ``fp8_gemm.quantize`` call a product makes."""
    calls: list[int] = []
    original = fp8_gemm.quantize

    def counted(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(x.shape[0])
        return original(x)

    monkeypatch.setattr(fp8_gemm, "quantize", counted)
    return calls


@pytest.mark.parametrize("family", FAMILIES)
def test_rows_quantized_where_made_give_the_quantize_launches_tokens(family: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    preset, dims = FAMILIES[family]
    config = {**PRESETS[preset][1], **SMALL, **dims}
    model = HybridModel.random(family, config, seed=3, device="cuda", head=True, fp8=True)
    requests = [Request(f"r{i}", tuple(range(20 + i, 60 + 7 * i)), 10, Sampling(temperature=1.0, seed=i))
                for i in range(3)]
    calls = quantize_launches(monkeypatch)
    fused = drive(model, requests, 64, graphs=False).tokens
    fused_calls = len(calls)
    in_graphs = drive(model, requests, 64, graphs=True).tokens
    drafted = drive(model, requests, 64, graphs=True, drafting=Drafting(2, 0.0)).tokens
    monkeypatch.setattr(ops, "fp8_room", lambda *_: None)  # every product quantizes its own rows again
    calls.clear()
    apart = drive(model, requests, 64, graphs=False).tokens
    assert list(fused) == list(apart) == list(in_graphs) == list(drafted)
    assert fused_calls < len(calls)

"""An FP8 checkpoint served as a user serves one: `tfd serve` on a tiny Qwen3.5-MoE with an MTP head in
Qwen's -FP8 layout (tests/tiny_models.py ``fp8_copy``, what the releases keep left in bf16), asked
through the official openai client: a reply repeats, a lane beside others is the lane alone, and the
log says what was read in FP8."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import tiny_models

from support import CACHE, ServedDaemon, started_server
from tfd.demo import build_once

QUANTIZATION = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [128, 128],
                "modules_to_not_convert": ["lm_head", "embed_tokens", "mlp.gate", "mlp.shared_expert_gate",
                                           "in_proj_b", "in_proj_a"]}
PROMPTS = [f"Count to {i}, then say why." for i in range(3, 7)]


def fp8_model() -> Path:
    source = tiny_models.save_served("qwen3_5_moe", CACHE / "tiny-head", head=True)
    return build_once(CACHE / "tiny-fp8" / "qwen3_5_moe", "config.json",
                      lambda staging: tiny_models.fp8_copy(source, staging, None, QUANTIZATION))


@pytest.fixture(scope="module")
def server() -> Iterator[ServedDaemon]:
    with started_server(TF_MODEL=str(fp8_model())) as daemon:
        yield daemon


def ask(client: openai.OpenAI, prompt: str, **sampling: object) -> str:
    chat = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=12,
                                          messages=[{"role": "user", "content": prompt}], **sampling)
    return chat.choices[0].message.content or ""


def test_the_load_says_what_it_read_in_fp8(server: ServedDaemon) -> None:
    assert "block-wise FP8: " in server.log() and " weights in FP8 (layers 0-3 and mtp)" in server.log()


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.9, "seed": 7}])
def test_an_fp8_reply_repeats_and_is_the_same_beside_others(server: ServedDaemon, sampling: dict[str, object]
                                                            ) -> None:
    with openai.OpenAI(base_url=server.url() + "/v1", api_key="unused", max_retries=0) as client:
        alone = [ask(client, prompt, **sampling) for prompt in PROMPTS]
        assert all(alone)
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            together = list(pool.map(lambda prompt: ask(client, prompt, **sampling), PROMPTS))
        assert together == alone
        assert ask(client, PROMPTS[0], **sampling) == alone[0]

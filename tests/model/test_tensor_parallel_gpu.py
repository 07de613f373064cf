"""Tensor parallel on one card: two ranks in processes of their own, both on the GPU over gloo (their sums
through the host: NCCL takes no two ranks on one card), run the kernels' path on their shares, bf16,
eagerly. What a machine of several GPUs adds (NCCL, its sums in the decode graphs) is not here; what
the shares do to the kernels (half the heads, half of every inner width) is: one rank's logits within
bf16's tolerance and its greedy tokens, and within the two ranks a lane alone draws what it draws
beside others, drafted, and resumed from a kept state. FP8 checkpoints too (heads of 128, every share
whole scale blocks). Three families: the device has no transformers to write the tiny checkpoints, and
what it is carried is bounded (``docs/bench/kit/tp_one_card.sh``); qwen3_5_moe's layers are qwen3_next's
and qwen3_5's."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_models
import torch
from test_tensor_parallel import ranks

from support import CACHE

pytestmark = pytest.mark.gpu
NEAR = 0.02  # the logits' largest difference over their largest magnitude: bf16 partials summed in fp32
ON_CARD = ("qwen3_5", "qwen3_next", "qwen4_exp")


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("family", ON_CARD)
def test_on_one_card_two_ranks_give_one_ranks_tokens_and_keep_the_contract(family: str, fp8: bool,
                                                                           tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    checkpoint = tiny_models.save_released_fp8(family, CACHE, aligned=True) if fp8 else \
        tiny_models.save(family, CACHE / "tiny-plain", head=True, expert_inner=128)  # carried
    one = ranks(checkpoint, 1, tmp_path / "one", device="cuda")
    split = ranks(checkpoint, 2, tmp_path / "split", device="cuda")
    assert one["heads"] == split["heads"] * 2
    whole, parts = torch.tensor(one["logits"]), torch.tensor(split["logits"])
    assert ((parts - whole).abs().max() / whole.abs().max()).item() < NEAR
    assert split["alone"][0] == one["alone"][0]  # greedy, where the tiny models' margins are wide
    assert split["together"] == split["alone"] == split["drafted"] and split["verified"] > 0
    assert split["resumed"] == [split["alone"][2]] * 2 and split["cached"][0] == 0 < split["cached"][1]

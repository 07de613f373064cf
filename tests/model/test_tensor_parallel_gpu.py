"""Tensor parallel on one card: two ranks in processes of their own, both on the GPU over gloo (their sums
through the host: NCCL takes no two ranks on one card), run the kernels' path on their shares, bf16,
eagerly. What a machine of several GPUs adds (NCCL, its sums in the decode graphs) is not here; what
the shares do to the kernels (half the heads, half of every inner width) is: the two ranks' logits as
near one rank's fp32 logits (on the CPU) as one rank's in bf16 are, one rank's first greedy tokens, and
within the two ranks a lane alone draws what it draws beside others, drafted, and resumed from a kept
state. FP8 checkpoints too (heads of 128, every share whole scale blocks). Three families: the device has
no transformers to write the tiny checkpoints, and what it is carried is bounded
(``docs/bench/kit/tp_one_card.sh``); qwen3_5_moe's layers are qwen3_next's and qwen3_5's."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_models
import torch
from reference_loop import row_error
from test_tensor_parallel import fp32_firsts, fp32_logits, ranks

from support import CACHE

pytestmark = pytest.mark.gpu
# the two ranks' error against fp32 at most this many times one rank's in bf16: their partials are rounded to
# bf16 once more before the fp32 sum. Their largest difference from one rank's bf16 logits passed 2% of the
# largest logit on the H100 (2026-12-05); the CPU in bf16 gives 2.3%, 11.8% and 1.5% (qwen3_5, qwen3_next,
# qwen4_exp) where the mean error against fp32 is 2.1% for two ranks, 1.9% for one; 2.7%, 3.2%; 1.1%, 1.0%
AS_NEAR = 1.5
FLOOR = 0.01  # an error under 1% passes whatever one rank's was
ON_CARD = ("qwen3_5", "qwen3_next", "qwen4_exp")
# the row a run draws its first token from lies within two of its errors of fp32's (the logits' own, and as
# much again for the engine's prefill of the same rows in another batch layout), so its token's fp32 logit
# within four of the best, and a margin wider than that leaves it only fp32's best
ERRORS = 4


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("family", ON_CARD)
def test_on_one_card_two_ranks_give_one_ranks_tokens_and_keep_the_contract(family: str, fp8: bool,
                                                                           tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    checkpoint = tiny_models.save_released_fp8(family, CACHE, aligned=True) if fp8 else \
        tiny_models.save(family, CACHE / "tiny-plain", head=True, expert_inner=128)  # carried
    exact = fp32_logits(checkpoint)  # one rank on the CPU, fp32
    one = ranks(checkpoint, 1, tmp_path / "one", device="cuda")
    split = ranks(checkpoint, 2, tmp_path / "split", device="cuda")
    assert one["heads"] == split["heads"] * 2
    whole, parts = (row_error(torch.tensor(run["logits"]), exact) for run in (one, split))
    assert parts <= max(AS_NEAR * whole, FLOOR), \
        f"two ranks err {parts:.4f} against fp32, one rank {whole:.4f}"
    # the greedy requests' first tokens: fp32's best where its top two lie further apart than the runs' error
    # on that row allows; in a nearer tie, which bf16 may break either way, each within that reach of the
    # best (2026-12-05, H100: qwen3_next's and FP8 qwen4_exp's first tokens parted, the logits within bound)
    for greedy, best in zip((0, 2), fp32_firsts(checkpoint), strict=True):
        reach = ERRORS * max((torch.tensor(run["firsts"][greedy // 2]) - best).abs().max().item()
                             for run in (one, split))
        top = best.topk(2).values.tolist()
        tokens = [run["alone"][greedy][0] for run in (one, split)]
        if top[0] - top[1] > reach:
            assert tokens == [int(best.argmax())] * 2
        else:
            assert all(best[token] >= top[0] - reach for token in tokens), (tokens, top, reach)
    assert split["together"] == split["alone"] == split["drafted"] and split["verified"] > 0
    assert split["resumed"] == [split["alone"][2]] * 2 and split["cached"][0] == 0 < split["cached"][1]

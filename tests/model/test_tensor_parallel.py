"""Tensor parallel on the CPU: two and four processes over torch.distributed's gloo backend, each loading
its share of a tiny checkpoint (``tfd.families.sharding``), give one process's logits within float
tolerance and its greedy tokens, and within the parallel size the contract holds bit for bit (a lane
alone draws what it draws beside others, drafted by the MTP head what it draws plainly, resumed from a
kept state what it draws fresh); a split the heads do not allow is refused by name. FP8 checkpoints split
too where every share is whole 128-wide scale blocks (heads of 128, inner widths of 256), and are
refused by name, the weight's kind said, where a share would cut a block."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import parallel_rank
import pytest
import tiny_models
import torch
from parallel_rank import first_rows, prompt_logits
from reference_loop import row_error

from support import CACHE, FORKED
from tfd.checkpoint import Checkpoint
from tfd.families.hybrid import load_model

# Ranks forked from a server that imported parallel_rank's imports (torch, tfd) once (support.FORKED): a
# fresh interpreter's imports cost about 2.5 s of CPU a rank, most of a small run's time; each rank is
# still a process of its own.
RANKS = FORKED
RUN_S = 600  # every rank of a run: start, load a tiny checkpoint, a few short requests, on a busy machine
NEAR = 1e-4  # the logits' largest difference over their largest magnitude: fp32 sums in another order
# an FP8 split's logits (mean row error against one rank's) within this share of how far FP8 moves one rank's
# from its float source: a flipped e4m3 rounding is one of the many roundings FP8 makes
FP8_DRIFT = 0.1


def fp32_logits(checkpoint: Path) -> torch.Tensor:
    """The prompt's logits that one rank on the CPU gives (``parallel_rank``'s), made in this process."""
    model = load_model(Checkpoint.open(checkpoint), "cpu", torch.float32, progress=False)
    return prompt_logits(model, "cpu", torch.float32)


def fp32_firsts(checkpoint: Path) -> list[torch.Tensor]:
    """The rows the greedy requests' first tokens come from, one rank on the CPU in fp32
    (``parallel_rank.first_rows``), made in this process."""
    model = load_model(Checkpoint.open(checkpoint), "cpu", torch.float32, progress=False)
    return first_rows(model, "cpu", torch.float32)


def ranks(checkpoint: Path, size: int, root: Path, experts: bool = False, device: str = "cpu"
          ) -> dict[str, Any]:
    """Run ``size`` ranks on ``checkpoint`` (``experts``: expert parallel; ``device`` "cuda": all on the
    one card, ``parallel_rank.py``'s), each a process of its own; what rank 0 wrote."""
    root.mkdir(parents=True, exist_ok=True)
    out = root / "out.json"
    logs = [root / f"rank{rank}.log" for rank in range(size)]
    started = [RANKS.Process(target=parallel_rank.logged, args=(
        str(logs[rank]), rank, size, str(root / "rendezvous"), str(checkpoint), str(out), experts, device))
        for rank in range(size)]
    for process in started:
        process.start()
    try:
        for process in started:
            process.join(RUN_S)
    finally:
        for process in started:
            if process.exitcode is None:
                process.kill()
                process.join()
    said = [log.read_text(errors="replace") if log.exists() else "" for log in logs]
    assert all(process.exitcode == 0 for process in started), \
        f"exit codes {[process.exitcode for process in started]}\n" + "\n".join(said)[-4000:]
    found: dict[str, Any] = json.loads(out.read_text())
    return found


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], dict[str, Any]]:
    """What one rank writes for a checkpoint (``parallel_rank.main`` without a group), run in this
    process once a checkpoint: the reference of every split of it."""
    seen: dict[Path, dict[str, Any]] = {}

    def run(checkpoint: Path) -> dict[str, Any]:
        if checkpoint not in seen:
            out = tmp_path_factory.mktemp("one") / "out.json"
            parallel_rank.main(0, 1, "", str(checkpoint), str(out), experts=False, device="cpu")
            seen[checkpoint] = json.loads(out.read_text())
        return seen[checkpoint]

    return run


@pytest.mark.parametrize(("family", "size", "experts"), [
    *[(family, size, False) for family in tiny_models.FAMILIES for size in (2, 4)],
    *[(family, 2, True) for family in tiny_models.FAMILIES if family != "qwen3_5"]])  # MoE: experts whole
def test_ranks_give_one_ranks_logits_and_tokens_and_keep_the_contract(
        family: str, size: int, experts: bool, one_rank: Callable[[Path], dict[str, Any]],
        tmp_path: Path) -> None:
    wide = size == 4  # the tiny models' 2 key-value heads split into 2; their wide twins' 4 into 4
    checkpoint = tiny_models.save(family, CACHE / "tiny-plain", head=True, wide=wide)
    one, split = one_rank(checkpoint), ranks(checkpoint, size, tmp_path / "split", experts)
    assert one["heads"] == split["heads"] * size and one["value_heads"] == split["value_heads"] * size
    whole, parts = torch.tensor(one["logits"]), torch.tensor(split["logits"])
    assert ((parts - whole).abs().max() / whole.abs().max()).item() < NEAR
    # greedy tokens equal where the margins allow: the top two logits of the tiny random models'
    # rows lie far further apart than the sums' reordering moves them (checked: the same tokens)
    assert split["alone"][0] == one["alone"][0] and split["alone"][2] == one["alone"][2]
    for run in (one, split):  # within a parallel size: concurrent == solo == drafted, resumed == fresh
        assert run["together"] == run["alone"] == run["drafted"] and run["verified"] > 0  # drafts checked
        assert run["resumed"] == [run["alone"][2]] * 2 and run["cached"][0] == 0 < run["cached"][1]


def test_a_split_the_key_value_heads_do_not_allow_is_refused_by_name(tmp_path: Path) -> None:
    checkpoint = tiny_models.save("qwen3_5", CACHE / "tiny-plain", head=True)
    found = ranks(checkpoint, 4, tmp_path)
    assert "TF_TENSOR_PARALLEL=4: the 2 key-value heads (num_key_value_heads) do not split into 4" \
        in found["refused"]
    assert "the 4 attention heads" not in found["refused"]  # 4 heads split into 4: not a reason


@pytest.mark.parametrize("family", tiny_models.FAMILIES)
def test_fp8_ranks_give_one_ranks_logits_and_keep_the_contract(
        family: str, one_rank: Callable[[Path], dict[str, Any]], tmp_path: Path) -> None:
    checkpoint = tiny_models.save_released_fp8(family, CACHE, aligned=True)
    source = tiny_models.save(family, CACHE / "tiny-plain", head=True, expert_inner=256, aligned=True)
    one, split = one_rank(checkpoint), ranks(checkpoint, 2, tmp_path / "split")
    assert "refused" not in split and one["heads"] == split["heads"] * 2
    whole, parts = torch.tensor(one["logits"]), torch.tensor(split["logits"])
    unquantized = fp32_logits(source)
    # a row's quantized groups are the whole model's (a column share's a subset), and the products
    # differ in the order of their fp32 sums, as float splits do; but an activation within an fp32
    # rounding of an e4m3 rounding edge then quantizes one e4m3 step (1/16) apart in the next layer, and
    # the logits drift on from there (2026-12-05: qwen3_5_moe's mean row error 3.4e-3, its largest 1.3e-2,
    # FP8's own 7.8e-2 from the source; the other families' 1e-7, no flip); a split's error in splitting
    # scales or quantized groups would be FP8's own size or more
    assert row_error(parts, whole) <= FP8_DRIFT * row_error(whole, unquantized)
    assert split["alone"][0] == one["alone"][0] and split["alone"][2] == one["alone"][2]
    assert split["together"] == split["alone"] == split["drafted"] and split["verified"] > 0
    assert split["resumed"] == [split["alone"][2]] * 2 and split["cached"][0] == 0 < split["cached"][1]


def test_an_fp8_split_that_cuts_a_scale_block_is_refused_naming_the_weight(tmp_path: Path) -> None:
    found = ranks(tiny_models.save_released_fp8("qwen3_5", CACHE), 2, tmp_path)
    assert "TF_TENSOR_PARALLEL=2: model.layers.N.self_attn.k_proj.weight [64, 64] is FP8 and splits into " \
        "shares of 32 along dimension 0, not whole 128-wide scale blocks" in found["refused"]
    assert "q_proj" not in found["refused"]  # 4 heads of 32 with their gates: 256 rows, halves of 128

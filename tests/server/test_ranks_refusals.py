"""What ``tfd serve --tensor-parallel N`` refuses before any rank starts (``tfd.server.ranks.refusals``),
on both sides of each line: an FP8 checkpoint whose shares cut a scale block and one whose shares are
whole blocks; on CUDA, a card named, more ranks than cards, experts placed whole."""

from __future__ import annotations

import os

import pytest
import tiny_models
import torch

from support import CACHE
from tfd.env import Table
from tfd.server.ranks import card_environ, refusals

TABLE = Table.load()


def refused(environ: dict[str, str], device: str, size: int) -> list[str]:
    return refusals(TABLE.read(environ), environ, torch.device(device), size)


def test_an_fp8_checkpoint_splits_where_its_shares_are_whole_scale_blocks() -> None:
    unaligned = {"TF_MODEL": str(tiny_models.save_released_fp8("qwen3_5", CACHE))}
    assert refused(unaligned, "cpu", 1) == []
    found = refused(unaligned, "cpu", 2)
    assert "TF_TENSOR_PARALLEL=2: model.layers.N.self_attn.k_proj.weight [64, 64] is FP8 and splits into " \
        "shares of 32 along dimension 0, not whole 128-wide scale blocks" in found
    assert not any("q_proj" in problem for problem in found)  # its 256 rows halve into whole blocks
    aligned = {"TF_MODEL": str(tiny_models.save_released_fp8("qwen3_5", CACHE, aligned=True))}
    assert refused(aligned, "cpu", 2) == []


def test_on_cuda_a_rank_takes_a_card_of_its_own() -> None:
    cards = torch.cuda.device_count()  # none on the CPU machine: any split is more ranks than cards
    assert any(f"a rank a card, and torch sees {cards} CUDA devices" in problem
               for problem in refused({}, "cuda", cards + 1))
    assert not any("a rank a card" in problem for problem in refused({}, "cpu", 2))
    assert "TF_DEVICE=cuda:1: under TF_TENSOR_PARALLEL=2 rank r runs on the r-th card; set TF_DEVICE=cuda " \
        "and choose the cards with CUDA_VISIBLE_DEVICES" in refused({}, "cuda:1", 2)
    experts = {"TF_DEMO": "flashnext", "TF_EXPERT_PARALLEL": "1", "TF_TENSOR_PARALLEL": "2"}
    assert any(problem.startswith("TF_EXPERT_PARALLEL=1: experts placed whole run on the CPU's path only")
               for problem in refused(experts, "cuda", 2))
    assert not any(problem.startswith("TF_EXPERT_PARALLEL") for problem in refused(experts, "cpu", 2))


def test_each_other_rank_sees_the_card_of_its_number_among_those_rank_0_sees(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, GPU-5e1a")
    assert [card_environ(rank)["CUDA_VISIBLE_DEVICES"] for rank in (0, 1)] == ["3", "GPU-5e1a"]
    assert card_environ(1)["PATH"] == os.environ["PATH"]  # the rest of the environment as it is

"""The training recipe: its schedule, a short run that learns, and the checkpoint it writes."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import attrs
import pytest
import torch
from reference_loop import greedy
from safetensors.torch import load_file
from test_train_corpus import write_tree

from support import run_tfd
from tfd.checkpoint import Checkpoint
from tfd.demo import DEMOS
from tfd.families.hybrid import load_model
from tfd.train.corpus import Corpus, Sampler
from tfd.train.loop import Trained, losses, train
from tfd.train.model import TrainModel
from tfd.train.recipe import Recipe
from tfd.train.written import check_out, write

CPU = torch.device("cpu")
SHORT = Recipe(steps=10, batch=2, seq=48, lr=3e-3, seed=5, log_every=4, eval_windows=2, mtp_target="data")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    root = tmp_path_factory.mktemp("corpus")
    write_tree(root, validation=3, train=12)
    return Corpus.read(root)


@pytest.fixture(scope="module")
def trained(corpus: Corpus) -> Trained:
    return train(SHORT, corpus, CPU)


def test_the_rate_warms_up_linearly_then_decays_to_a_tenth() -> None:
    recipe = Recipe(steps=1000, lr=1.0)
    assert recipe.warmup == 50
    assert recipe.rate(0) == pytest.approx(1 / 50)
    assert recipe.rate(49) == pytest.approx(1.0)
    rates = [recipe.rate(step) for step in range(50, 1000)]
    assert all(a >= b for a, b in itertools.pairwise(rates))
    assert rates[-1] == pytest.approx(0.1, abs=1e-4)
    assert Recipe(steps=10_000).warmup == 200


def test_a_recipe_refuses_a_bad_value_by_name() -> None:
    with pytest.raises(ValueError, match="recipe seq must be at least 1"):
        Recipe(seq=0)
    with pytest.raises(ValueError, match="recipe minutes must be positive"):
        Recipe(minutes=0.0)


def test_a_few_steps_lower_the_loss(trained: Trained) -> None:
    assert trained.steps == SHORT.steps
    assert [entry["step"] for entry in trained.history] == [4, 8, 10]
    assert trained.history[-1]["loss"] < trained.history[0]["loss"]
    assert trained.after.lm_loss < trained.before.lm_loss - 0.5
    assert trained.after.mtp_loss < trained.before.mtp_loss - 0.5
    assert 0 <= trained.after.mtp_confident <= 1
    assert trained.after.positions in (SHORT.seq, 2 * SHORT.seq)  # a window or two fit the split


def test_a_head_taught_by_the_main_model_learns_its_distribution(corpus: Corpus) -> None:
    # self-distillation: the head's loss is its cross-entropy against the main model's next
    # distribution, which the head's training leaves untouched (no gradient through the target)
    model = TrainModel.random(DEMOS["qwen3_5"][1], 1, CPU)
    windows = Sampler(corpus.train, 2, 34, 1).draw()
    lm, mtp = losses(model, windows, CPU, "main")
    out = model.forward(windows[:, :-2], windows[:, 1:-1])
    assert out.draft_logits is not None
    wanted = torch.softmax(out.logits[:, 1:].float(), dim=-1)
    by_hand = -(wanted * torch.log_softmax(out.draft_logits[:, :-1].float(), dim=-1)).sum(dim=-1).mean()
    assert torch.allclose(mtp, by_hand) and torch.allclose(lm, losses(model, windows, CPU, "data")[0])
    mtp.backward()
    assert model.params["mtp.fc.weight"].grad is not None
    taught = train(attrs.evolve(SHORT, mtp_target="main"), corpus, CPU)  # the default, SHORT says "data"
    assert taught.history[-1]["mtp_loss"] < taught.history[0]["mtp_loss"]
    assert taught.after.mtp_agrees >= 0 and taught.after.lm_loss < taught.before.lm_loss - 0.5
    with pytest.raises(ValueError, match="recipe mtp_target must be one of data, main, got 'text'"):
        Recipe(mtp_target="text")


def test_the_same_recipe_trains_the_same_weights(corpus: Corpus, trained: Trained) -> None:
    again = train(Recipe(steps=2, batch=2, seq=48, lr=3e-3, seed=5, eval_windows=1), corpus, CPU)
    twice = train(Recipe(steps=2, batch=2, seq=48, lr=3e-3, seed=5, eval_windows=1), corpus, CPU)
    assert all(torch.equal(again.model.params[name], twice.model.params[name]) for name in again.model.params)


def test_the_written_directory_loads_and_generates(trained: Trained, corpus: Corpus, tmp_path: Path) -> None:
    out = tmp_path / "trained"
    record = write(out, trained, SHORT, corpus, CPU, DEMOS["qwen3_5"][1])
    written = sorted(p.name for p in out.iterdir())
    assert written == ["chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
                       "tokenizer.json", "tokenizer_config.json", "training.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trained"]  # no staging left
    assert json.loads((out / "training.json").read_text()) == record
    assert record["steps"] == SHORT.steps and record["recipe"]["lr"] == SHORT.lr
    assert record["corpus"]["sha256"] == corpus.digest()
    weights = load_file(out / "model.safetensors")
    assert all(t.dtype == torch.bfloat16 for t in weights.values())
    assert all(torch.equal(weights[name], t) for name, t in trained.model.bf16().items())
    checkpoint = Checkpoint.open(out)
    model = load_model(checkpoint, dtype=torch.float32, progress=False)
    assert model.head is not None
    prompt = checkpoint.tokenizer().encode("def add(a, b):\n").ids
    assert len(greedy(model, prompt, 4).tokens) >= 1


def test_a_run_stops_at_its_minutes(corpus: Corpus) -> None:
    stopped = train(Recipe(steps=1000, batch=1, seq=16, minutes=1e-6, eval_windows=1), corpus, CPU)
    assert stopped.steps < 1000


def test_an_out_directory_with_files_is_refused_before_training(tmp_path: Path) -> None:
    (tmp_path / "old").mkdir()
    check_out(tmp_path / "old")  # empty: fine
    (tmp_path / "old" / "x").write_text("")
    with pytest.raises(FileExistsError, match="already exists"):
        check_out(tmp_path / "old")
    done = run_tfd("train-demo", "--out", str(tmp_path / "old"), "--device", "cpu", forked=True)
    assert done.returncode == 1
    assert "already exists and is not an empty directory" in done.stderr
    done = run_tfd("train-demo", "--out", str(tmp_path / "new"), "--lr", "-1", forked=True)
    assert done.returncode == 2
    assert "--lr: must be a positive number, got '-1'" in done.stderr

"""The embedded demo models and `tfd generate` on them."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from reference_loop import greedy

from support import clean_environ, run_tfd
from tfd.checkpoint import Checkpoint
from tfd.demo import DEMOS, IM_END, build_demo
from tfd.families.hybrid import load_model


def digest(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


@pytest.mark.parametrize("name", list(DEMOS))
def test_a_demo_builds_the_same_bytes_anywhere_and_once(name: str, tmp_path: Path) -> None:
    first = build_demo(name, tmp_path / "a")
    second = build_demo(name, tmp_path / "b")
    assert first.name == second.name
    assert digest(first) == digest(second)
    built = (first / "model.safetensors").stat().st_mtime_ns
    assert build_demo(name, tmp_path / "a") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == built  # not rebuilt
    assert sorted(p.name for p in first.parent.iterdir()) == [first.name]  # no staging left


@pytest.mark.parametrize("name", list(DEMOS))
def test_a_demo_is_a_real_checkpoint_with_a_head_a_tokenizer_and_a_template(name: str,
                                                                            tmp_path: Path) -> None:
    checkpoint = Checkpoint.open(build_demo(name, tmp_path))
    assert checkpoint.family == DEMOS[name][0]
    model = load_model(checkpoint, dtype=torch.float32, progress=False)
    assert model.head is not None
    tokenizer = checkpoint.tokenizer()
    text = "def f(x):\n    return 'café' + x  # 日本\n"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text
    template = checkpoint.chat_template()
    assert template is not None
    prompt = template.render([{"role": "user", "content": "Hi"}])
    assert prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.encode(prompt).ids.count(tokenizer.token_to_id("<|im_start|>")) == 2
    assert IM_END in checkpoint.eos_ids
    assert len(greedy(model, tokenizer.encode(prompt).ids, 5).tokens) >= 1


def test_generate_prints_only_the_continuation(tmp_path: Path) -> None:
    env = clean_environ(TF_CACHE_DIR=str(tmp_path))
    done = run_tfd("generate", "--prompt", "def main():", "--max-tokens", "12", env=env, timeout=120,
                   forked=True)
    assert done.returncode == 0, done.stderr
    assert "loaded qwen3_5" in done.stderr
    assert "tok/s" in done.stderr
    checkpoint = Checkpoint.open(build_demo("qwen3_5", tmp_path))
    model = load_model(checkpoint, dtype=torch.float32, progress=False)
    tokenizer = checkpoint.tokenizer()
    tokens = greedy(model, tokenizer.encode("def main():").ids, 12, stop=checkpoint.eos_ids).tokens
    expected = tokenizer.decode([t for t in tokens if t not in checkpoint.eos_ids])
    assert done.stdout == expected + "\n"


def test_another_familys_row_stops_a_start_only_when_malformed(tmp_path: Path) -> None:
    # Well formed, but not applicable (pieces need pages): only a Flash Next start refuses it.
    env = clean_environ(TF_CACHE_DIR=str(tmp_path), TF_FLASHNEXT_STATE_PAGES="1", TF_FLASHNEXT_KV_PAGES="0")
    assert run_tfd("generate", "--prompt", "x", "--max-tokens", "1", env=env, timeout=120,
                   forked=True).returncode == 0
    done = run_tfd("generate", "--prompt", "x", "--max-tokens", "1", "--demo", "flashnext", env=env,
                   timeout=120, forked=True)
    assert done.returncode == 2
    assert "TF_FLASHNEXT_STATE_PAGES=1 requires TF_FLASHNEXT_KV_PAGES, which is 0 (off)" in done.stderr
    # Malformed: refused whatever loads.
    env = clean_environ(TF_CACHE_DIR=str(tmp_path), TF_FLASHNEXT_STATE_PAGES="2")
    done = run_tfd("generate", "--prompt", "x", "--max-tokens", "1", env=env, timeout=120, forked=True)
    assert done.returncode == 2
    assert "TF_FLASHNEXT_STATE_PAGES=2: must be exactly 0 or 1" in done.stderr


def test_random_weights_need_only_the_config_and_tokenizer(tmp_path: Path) -> None:
    built = build_demo("flashnext", tmp_path / "cache")
    shapes_only = tmp_path / "shapes"
    shapes_only.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (shapes_only / name).write_bytes((built / name).read_bytes())
    env = clean_environ(TF_MODEL=str(shapes_only))
    plain = run_tfd("generate", "--prompt", "x", "--max-tokens", "2", env=env, timeout=120, forked=True)
    assert plain.returncode == 1
    assert "no model.safetensors" in plain.stderr
    drawn = run_tfd("generate", "--prompt", "x", "--max-tokens", "2", "--random-weights", env=env,
                    timeout=120, forked=True)
    assert drawn.returncode == 0, drawn.stderr
    assert "random weights" in drawn.stderr

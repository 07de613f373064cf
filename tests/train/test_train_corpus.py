"""The demo's training corpus: the same tokens from the same files, a disjoint split by path."""

from __future__ import annotations

from pathlib import Path

import pytest
import tokenizers
import torch

from tfd.demo import ENDOFTEXT, TOKENIZER
from tfd.train.corpus import Corpus, Sampler, is_validation, source_files, tiles

SOURCE = "def add(a, b):\n    return a + b  # {n}\n\n\nclass Point:\n    x: int = {n}\n"


def names(validation: int, train: int) -> list[str]:
    """Relative paths, the first ``validation`` of them held out by their hash, the rest not."""
    held, kept = [], []
    for n in range(10_000):
        name = f"pkg{n % 3}/mod{n}.py"
        (held if is_validation(name) else kept).append(name)
        if len(held) >= validation and len(kept) >= train:
            return held[:validation] + kept[:train]
    raise AssertionError("no such names")


def write_tree(root: Path, validation: int = 2, train: int = 6) -> list[str]:
    files = names(validation, train)
    for n, name in enumerate(files):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(SOURCE.format(n=n))
    return files


def test_the_stream_is_each_files_tokens_then_end_of_text_in_path_order(tmp_path: Path) -> None:
    files = write_tree(tmp_path)
    corpus = Corpus.read(tmp_path)
    coder = tokenizers.Tokenizer.from_file(str(TOKENIZER))

    def tokens(held: bool) -> list[int]:
        chosen = sorted(name for name in files if is_validation(name) == held)
        return [i for name in chosen for i in [*coder.encode((tmp_path / name).read_text()).ids, ENDOFTEXT]]

    assert corpus.train.tolist() == tokens(held=False)
    assert corpus.validation.tolist() == tokens(held=True)
    assert corpus.train.dtype == torch.int32
    assert (corpus.train_files, corpus.validation_files) == (6, 2)


def test_two_reads_agree_wherever_the_tree_lies(tmp_path: Path) -> None:
    files = write_tree(tmp_path)
    first, second = Corpus.read(tmp_path), Corpus.read(tmp_path)
    assert first.digest() == second.digest()
    assert torch.equal(first.train, second.train) and torch.equal(first.validation, second.validation)
    assert first.train_files + first.validation_files == len(files)
    moved = tmp_path / "moved"
    moved.mkdir()
    for name in files:  # the split follows the relative path, not where the tree lies
        (moved / name).parent.mkdir(parents=True, exist_ok=True)
        (moved / name).write_bytes((tmp_path / name).read_bytes())
    assert Corpus.read(moved).digest() == first.digest()


def test_about_one_file_in_twenty_is_held_out() -> None:
    share = sum(is_validation(f"Lib/m{n}.py") for n in range(4000)) / 4000
    assert 0.04 < share < 0.06


def test_non_utf8_and_empty_files_are_skipped_and_counted_and_third_party_left_out(tmp_path: Path) -> None:
    write_tree(tmp_path)
    (tmp_path / "latin.py").write_bytes("# -*- coding: latin-1 -*-\nname = 'caf\xe9'\n".encode("latin-1"))
    (tmp_path / "empty.py").write_text("\n")
    (tmp_path / "site-packages" / "thirdparty").mkdir(parents=True)
    (tmp_path / "site-packages" / "thirdparty" / "x.py").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text("not python\n")
    corpus = Corpus.read(tmp_path)
    assert corpus.skipped == ("latin.py",)
    assert corpus.empty == 1
    assert not any(name.startswith("site-packages") for name in source_files(tmp_path))
    assert corpus.summary()["skipped_not_utf8"] == 1


def test_a_missing_root_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        Corpus.read(tmp_path / "nowhere")


def test_the_sampler_draws_the_same_windows_from_the_same_seed() -> None:
    tokens = torch.arange(1000, dtype=torch.int32)
    first, second, other = (Sampler(tokens, 4, 10, seed) for seed in (7, 7, 8))
    drawn = [first.draw() for _ in range(3)]
    assert all(torch.equal(a, second.draw()) for a in drawn)
    assert not torch.equal(drawn[0], other.draw())
    window = drawn[0]
    assert window.shape == (4, 10) and window.dtype == torch.int64
    assert torch.equal(window[:, 1:] - window[:, :-1], torch.ones(4, 9, dtype=torch.int64))  # contiguous


def test_a_split_shorter_than_a_window_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="the train split has 5 tokens, fewer than a window of 10"):
        Sampler(torch.arange(5, dtype=torch.int32), 2, 10, 0)
    with pytest.raises(ValueError, match="the validation split has 5 tokens"):
        tiles(torch.arange(5, dtype=torch.int32), 10, 4)
    assert tiles(torch.arange(35, dtype=torch.int32), 10, 4).tolist()[2] == list(range(20, 30))

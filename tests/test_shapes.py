"""Released shapes served with random weights: the directory `tfd serve --shape` loads, its tokenizer.

Serving a shape end to end needs a GPU (tests/server/test_shape_serving.py); on the CPU the
directory it loads is checked: its config, its MTP head, and a tokenizer that covers the vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tokenizers

from support import clean_environ, run_tfd
from tfd import demo
from tfd.env import Table
from tfd.shapes import PRESETS, covering_tokenizer, fit, write_shape

TEXT = "def f(x):\n    return x + 1  # <12345> is text, not an id\n"


def test_the_table_offers_every_preset_and_no_other() -> None:
    row = Table.load().by_name()["TF_SHAPE"]
    assert row.kind.values == tuple(PRESETS)  # type: ignore[attr-defined]
    assert row.flag == "--shape" and row.excludes == "TF_MODEL"


@pytest.mark.parametrize("name", list(PRESETS))
def test_a_shape_is_a_directory_whose_tokenizer_covers_its_vocabulary(name: str, tmp_path: Path) -> None:
    shape = fit(name, 1 << 50)
    directory = write_shape(shape, tmp_path)
    assert write_shape(shape, tmp_path) == directory  # built once
    config = json.loads((directory / "config.json").read_text())
    assert config == {**PRESETS[name][1], "mtp_num_hidden_layers": 1}
    assert not list(directory.glob("*.safetensors"))
    assert (directory / "chat_template.jinja").read_text() == demo.CHAT_TEMPLATE.read_text()
    tokenizer = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    vocab = config["vocab_size"]
    assert tokenizer.get_vocab_size() == vocab
    ids = [demo.VOCAB - 1, demo.VOCAB, config["eos_token_id"], vocab - 1]
    assert [tokenizer.decode([i]) for i in ids[1:]] == [f"<{i}>" for i in ids[1:]]
    assert tokenizer.decode([ids[0]]) == demo_tokenizer().decode([ids[0]])
    assert tokenizer.id_to_token(vocab) is None
    # Text still encodes as the demo's tokenizer encodes it: ids below its 4,096.
    encoded = tokenizer.encode(TEXT).ids
    assert encoded == demo_tokenizer().encode(TEXT).ids and max(encoded) < demo.VOCAB
    assert tokenizer.decode(encoded) == TEXT


def test_every_id_of_the_largest_vocabulary_detokenizes() -> None:
    vocab = max(config["vocab_size"] for _, config in PRESETS.values())
    tokenizer = tokenizers.Tokenizer.from_str(covering_tokenizer(vocab))
    decoded = tokenizer.decode_batch([[i] for i in range(vocab)], skip_special_tokens=False)
    assert all(decoded)  # the demo's single bytes past ASCII decode to U+FFFD alone, as ever
    assert decoded[demo.VOCAB:] == [f"<{i}>" for i in range(demo.VOCAB, vocab)]


def test_a_vocabulary_smaller_than_the_demos_is_refused() -> None:
    covering_tokenizer(demo.VOCAB)  # exactly the demo's: nothing to add
    with pytest.raises(ValueError, match="smaller than the demo tokenizer's 4096"):
        covering_tokenizer(demo.VOCAB - 1)


def test_a_shape_and_a_model_together_are_refused_naming_both(short_tmp: Path) -> None:
    # a short path: the refusal shortens a long value, and pytest's own temporary paths vary in length
    done = run_tfd("serve", "--shape", "qwen3_5-9b", env=clean_environ(TF_MODEL=str(short_tmp)))
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"tfd: configuration refused:\n  --shape qwen3_5-9b (TF_SHAPE) excludes TF_MODEL, "
                           f"which is set too (TF_MODEL={short_tmp}): set one\n")
    assert run_tfd("serve", "--shape", "qwen3-9b").returncode == 2  # not a preset


def test_a_shapes_family_rows_are_checked_before_anything_loads() -> None:
    # Flash Next's pieces need its pages: refused for its shape, before a weight is drawn.
    done = run_tfd("serve", env=clean_environ(TF_SHAPE="qwen3_8-flash-next", TF_FLASHNEXT_KV_PAGES="0",
                                               TF_FLASHNEXT_STATE_PAGES="1"))
    assert done.returncode == 2, done.stderr
    assert "TF_FLASHNEXT_STATE_PAGES=1 requires TF_FLASHNEXT_KV_PAGES, which is 0 (off)" in done.stderr


def demo_tokenizer() -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_file(str(demo.TOKENIZER))

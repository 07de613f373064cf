"""Checkpoint directories on disk: config, headers, refusals by name, loading, tokenizer."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import safetensors
import safetensors.torch
import torch
from checkpoint_files import TENSORS, make_checkpoint, make_sharded, write_json, write_raw
from tokenizers import Tokenizer, models, pre_tokenizers

from tfd.checkpoint import (
    LISTED_PROBLEMS,
    Checkpoint,
    CheckpointError,
    TensorSpec,
    open_checkpoint,
)


def refusal(directory: Path) -> str:
    with pytest.raises(CheckpointError) as caught:
        open_checkpoint(directory)
    return str(caught.value)


# -- config and family -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def transformers_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3_5TextConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, intermediate_size=48, linear_num_key_heads=1, linear_num_value_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=8, eos_token_id=7)
    directory = tmp_path_factory.mktemp("qwen3_5")
    torch.manual_seed(0)
    transformers.Qwen3_5ForCausalLM(config).save_pretrained(directory)
    return Path(directory)


def test_a_transformers_checkpoint_opens_with_the_headers_safetensors_reports(
        transformers_checkpoint: Path) -> None:
    checkpoint = open_checkpoint(transformers_checkpoint)
    assert checkpoint.family == "qwen3_5"
    assert checkpoint.text_config["hidden_size"] == 32
    assert checkpoint.eos_ids == (7,)
    file = transformers_checkpoint / "model.safetensors"
    with safetensors.safe_open(file, "pt") as handle:
        assert set(checkpoint.tensors) == set(handle.keys())
        for name in handle.keys():  # noqa: SIM118 (safe_open is no mapping)
            view = handle.get_slice(name)
            info = checkpoint.tensors[name]
            assert (info.shape, info.dtype, info.file) == (tuple(view.get_shape()), view.get_dtype(), file)
    expected = safetensors.torch.load_file(file)
    loaded = checkpoint.load(checkpoint.tensors, "cpu", None)
    assert loaded.keys() == expected.keys()
    for name, tensor in expected.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor)
    checkpoint.check({name: TensorSpec(tuple(t.shape)) for name, t in expected.items()})


@pytest.mark.parametrize(("model_type", "family"), [
    ("qwen3_5", "qwen3_5"), ("qwen3_5_text", "qwen3_5"), ("qwen3_5_moe", "qwen3_5_moe"),
    ("qwen3_5_moe_text", "qwen3_5_moe"), ("qwen3_next", "qwen3_next"), ("qwen4_exp", "qwen4_exp"),
    ("qwen4_exp_text", "qwen4_exp"),
])
def test_every_known_model_type_names_its_family(tmp_path: Path, model_type: str, family: str) -> None:
    assert open_checkpoint(make_checkpoint(tmp_path, config={"model_type": model_type})).family == family


def test_the_text_config_wins_over_the_top_and_the_top_stays_readable(tmp_path: Path) -> None:
    config = {"model_type": "qwen3_5_moe", "tie_word_embeddings": True, "hidden_size": 1,
              "vision_config": {"depth": 2},
              "text_config": {"model_type": "qwen3_5_moe_text", "hidden_size": 32, "eos_token_id": [3, 4]}}
    checkpoint = open_checkpoint(make_checkpoint(tmp_path, config=config))
    assert checkpoint.family == "qwen3_5_moe"
    assert checkpoint.text_config["hidden_size"] == 32
    assert checkpoint.text_config["tie_word_embeddings"] is True
    assert checkpoint.config.root["hidden_size"] == 1
    assert checkpoint.eos_ids == (3, 4)


def test_a_text_config_without_model_type_takes_the_top_one(tmp_path: Path) -> None:
    config = {"model_type": "qwen4_exp", "text_config": {"hidden_size": 32}}
    assert open_checkpoint(make_checkpoint(tmp_path, config=config)).family == "qwen4_exp"


def test_an_unknown_model_type_is_refused_by_name_with_the_known_ones(tmp_path: Path) -> None:
    message = refusal(make_checkpoint(tmp_path, config={"model_type": "llama"}))
    assert "'llama'" in message and "qwen3_next" in message and "config.json" in message
    nested = {"model_type": "qwen3_5", "text_config": {"model_type": "gemma3_text"}}
    assert "'gemma3_text'" in refusal(make_checkpoint(tmp_path / "nested", config=nested))


def test_a_missing_config_is_refused_naming_the_file(tmp_path: Path) -> None:
    assert str(tmp_path / "config.json") in refusal(tmp_path)


def test_a_config_that_is_not_json_is_refused_naming_the_file(tmp_path: Path) -> None:
    make_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{model_type: qwen3_next")
    message = refusal(tmp_path)
    assert str(tmp_path / "config.json") in message and "not JSON" in message


def test_no_safetensors_is_refused_naming_the_directory(tmp_path: Path) -> None:
    write_json(tmp_path / "config.json", {"model_type": "qwen3_next"})
    assert refusal(tmp_path).startswith(f"{tmp_path}: no model.safetensors")


# -- check -----------------------------------------------------------------------------------------

def expected_specs() -> dict[str, TensorSpec]:
    return {name: TensorSpec(tuple(t.shape), None if t.is_floating_point() else frozenset({"I64"}))
            for name, t in TENSORS.items()}


def check_refusal(checkpoint: Checkpoint, expected: dict[str, TensorSpec]) -> str:
    with pytest.raises(CheckpointError) as caught:
        checkpoint.check(expected)
    return str(caught.value)


def test_check_passes_matching_tensors_and_allows_extras(tmp_path: Path) -> None:
    checkpoint = open_checkpoint(make_checkpoint(tmp_path))
    checkpoint.check(expected_specs())
    checkpoint.check({"model.norm.weight": TensorSpec((4,))})  # BF16 is among the default floats


def test_check_names_a_missing_tensor(tmp_path: Path) -> None:
    expected = expected_specs() | {"lm_head.weight": TensorSpec((6, 4))}
    message = check_refusal(open_checkpoint(make_checkpoint(tmp_path)), expected)
    assert "lm_head.weight: missing" in message and "1 problem)" in message


def test_check_names_a_wrong_shape_with_both_shapes(tmp_path: Path) -> None:
    expected = expected_specs() | {"model.layers.0.mlp.weight": TensorSpec((4, 3))}
    message = check_refusal(open_checkpoint(make_checkpoint(tmp_path)), expected)
    assert "model.layers.0.mlp.weight: shape [3, 4], expected [4, 3]" in message


def test_check_names_a_wrong_dtype_with_the_allowed_ones(tmp_path: Path) -> None:
    expected = expected_specs() | {"model.positions": TensorSpec((5,)),
                                   "model.norm.weight": TensorSpec((4,), frozenset({"F32"}))}
    message = check_refusal(open_checkpoint(make_checkpoint(tmp_path)), expected)
    assert "model.positions: dtype I64, expected BF16 or F16 or F32" in message
    assert "model.norm.weight: dtype BF16, expected F32" in message and "2 problems" in message


def test_check_lists_every_problem_up_to_a_cap(tmp_path: Path) -> None:
    expected = {f"model.layers.{i}.missing": TensorSpec((1,)) for i in range(LISTED_PROBLEMS + 5)}
    message = check_refusal(open_checkpoint(make_checkpoint(tmp_path)), expected)
    lines = message.splitlines()
    assert len(lines) == 1 + LISTED_PROBLEMS + 1 and lines[-1] == "  and 5 more"
    assert f"({LISTED_PROBLEMS + 5} problems)" in lines[0]


# -- broken files and indexes ----------------------------------------------------------------------

def test_an_index_listing_a_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    make_sharded(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    message = refusal(tmp_path)
    assert "model.safetensors.index.json" in message and "model-00002-of-00002.safetensors" in message


def test_an_index_naming_a_tensor_the_shard_lacks_is_refused_naming_both(tmp_path: Path) -> None:
    make_sharded(tmp_path)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    index["weight_map"]["lm_head.weight"] = "model-00001-of-00002.safetensors"
    write_json(tmp_path / "model.safetensors.index.json", index)
    message = refusal(tmp_path)
    assert "lm_head.weight" in message and "model-00001-of-00002.safetensors" in message


@pytest.mark.parametrize(("text", "problem"), [("{", "not JSON"), ('{"metadata": {}}', "weight_map")])
def test_a_broken_index_is_refused_naming_it(tmp_path: Path, text: str, problem: str) -> None:
    make_sharded(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(text)
    message = refusal(tmp_path)
    assert str(tmp_path / "model.safetensors.index.json") in message and problem in message


def test_a_truncated_header_is_refused_naming_the_file(tmp_path: Path) -> None:
    make_checkpoint(tmp_path)
    file = tmp_path / "model.safetensors"
    file.write_bytes(file.read_bytes()[:40])
    message = refusal(tmp_path)
    assert str(file) in message and "truncated" in message
    file.write_bytes(b"\x10\x00")
    assert "truncated" in refusal(tmp_path)


def test_a_header_that_is_not_json_is_refused_naming_the_file(tmp_path: Path) -> None:
    make_checkpoint(tmp_path)
    file = tmp_path / "model.safetensors"
    file.write_bytes(struct.pack("<Q", 5) + b"{oops" + bytes(8))
    message = refusal(tmp_path)
    assert str(file) in message and "not JSON" in message


def test_offsets_past_the_end_are_refused_naming_the_tensor(tmp_path: Path) -> None:
    make_checkpoint(tmp_path)
    file = tmp_path / "model.safetensors"
    write_raw(file, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                     "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, bytes(16))
    message = refusal(tmp_path)
    assert str(file) in message and "tensor b" in message and "past the end" in message


def test_offsets_that_disagree_with_dtype_and_shape_are_refused_naming_the_tensor(tmp_path: Path) -> None:
    make_checkpoint(tmp_path)
    file = tmp_path / "model.safetensors"
    write_raw(file, {"__metadata__": {"format": "pt"},
                     "w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 24]}}, bytes(24))
    message = refusal(tmp_path)
    assert "tensor w" in message and "needs 12" in message


def test_overlapping_tensors_are_refused_naming_both(tmp_path: Path) -> None:
    make_checkpoint(tmp_path)
    write_raw(tmp_path / "model.safetensors", {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                               "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}},
              bytes(12))
    assert "tensors a and b overlap" in refusal(tmp_path)


# -- loading ---------------------------------------------------------------------------------------

def test_a_sharded_checkpoint_loads_the_same_tensors_as_one_file(tmp_path: Path) -> None:
    single = open_checkpoint(make_checkpoint(tmp_path / "single"))
    sharded = open_checkpoint(make_sharded(tmp_path / "sharded"))
    assert {n: (i.shape, i.dtype) for n, i in single.tensors.items()} == \
        {n: (i.shape, i.dtype) for n, i in sharded.tensors.items()}
    assert len({info.file for info in sharded.tensors.values()}) == 2
    names = list(reversed(sorted(TENSORS)))
    one, two = single.load(names, "cpu", None), sharded.load(names, "cpu", None)
    assert list(two) == names
    for name in names:
        assert torch.equal(one[name], TENSORS[name]) and torch.equal(two[name], TENSORS[name])


def test_shards_of_a_table_load_joined_in_order_from_any_file(tmp_path: Path) -> None:
    """The last shard in the first file, the first in the second: rows land by the shards' order,
    each cast as it is copied in; the shards' own names are not in the answer."""
    parts = [torch.arange(k * 12, (k + 1) * 12, dtype=torch.float32).view(-1, 4)[: 3 - k] for k in range(3)]
    names = [f"t.shard_{k}.weight" for k in range(3)]
    directory = tmp_path / "joined"
    directory.mkdir()
    write_json(directory / "config.json", {"model_type": "qwen3_next"})
    files = {"model-00001-of-00002.safetensors": [names[2], "other"],
             "model-00002-of-00002.safetensors": names[:2]}
    tensors = {**dict(zip(names, parts, strict=True)), "other": torch.ones(2)}
    for file, held in files.items():
        safetensors.torch.save_file({n: tensors[n] for n in held}, str(directory / file))
    write_json(directory / "model.safetensors.index.json",
               {"metadata": {}, "weight_map": {n: f for f, held in files.items() for n in held}})
    checkpoint = open_checkpoint(directory)
    loaded = checkpoint.load([*names, "other"], "cpu", torch.bfloat16, joined={"t.weight": names})
    assert sorted(loaded) == ["other", "t.weight"]
    assert loaded["t.weight"].dtype == torch.bfloat16
    assert torch.equal(loaded["t.weight"], torch.cat(parts).bfloat16())
    one = checkpoint.load(["other"], "cpu", None, joined={"t.weight": names[:1]})  # parts need not be asked
    assert sorted(one) == ["other", "t.weight"] and torch.equal(one["t.weight"], parts[0])


def test_shards_that_differ_past_their_rows_are_refused_naming_the_table(tmp_path: Path) -> None:
    directory = tmp_path / "uneven"
    directory.mkdir()
    write_json(directory / "config.json", {"model_type": "qwen3_next"})
    uneven = {"t.shard_0.weight": torch.zeros(2, 4), "t.shard_1.weight": torch.zeros(2, 5)}
    safetensors.torch.save_file(uneven, str(directory / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"t\.weight: its parts t\.shard_0\.weight, t\.shard_1\.weight "
                                              r"do not join"):
        open_checkpoint(directory).load([], "cpu", None, joined={"t.weight": ["t.shard_0.weight",
                                                                              "t.shard_1.weight"]})


def test_load_casts_floating_tensors_and_keeps_integer_ones(tmp_path: Path) -> None:
    checkpoint = open_checkpoint(make_checkpoint(tmp_path))
    loaded = checkpoint.load(TENSORS, torch.device("cpu"), torch.bfloat16)
    assert loaded["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert torch.equal(loaded["model.embed_tokens.weight"], TENSORS["model.embed_tokens.weight"].bfloat16())
    assert loaded["model.positions"].dtype == torch.int64
    assert checkpoint.load_one("model.norm.weight", dtype=torch.float32).dtype == torch.float32


def test_load_refuses_an_unknown_name_before_reading(tmp_path: Path) -> None:
    checkpoint = open_checkpoint(make_checkpoint(tmp_path))
    with pytest.raises(CheckpointError, match=r"no tensor named lm_head\.weight"):
        checkpoint.load(["model.norm.weight", "lm_head.weight"], "cpu", None)


def test_the_progress_bar_draws_on_stderr_only_when_asked_or_a_terminal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = open_checkpoint(make_checkpoint(tmp_path))
    checkpoint.load(TENSORS, "cpu", None, progress=True)
    drawn = capsys.readouterr().err
    assert drawn.startswith("\rloading weights") and drawn.endswith("\n") and "100%" in drawn
    assert "MB/s" in drawn
    checkpoint.load(TENSORS, "cpu", None)  # captured stderr is no terminal
    assert capsys.readouterr().err == ""


# -- tokenizer, eos --------------------------------------------------------------------------------

def test_the_tokenizer_round_trips(tmp_path: Path) -> None:
    checkpoint = open_checkpoint(make_checkpoint(tmp_path))
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    built = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    built.pre_tokenizer = pre_tokenizers.Whitespace()
    built.save(str(tmp_path / "tokenizer.json"))
    tokenizer = checkpoint.tokenizer()
    ids = tokenizer.encode("hello world").ids
    assert ids == [1, 2] and tokenizer.decode(ids) == "hello world"


def test_a_missing_or_broken_tokenizer_is_refused_naming_the_file(tmp_path: Path) -> None:
    checkpoint = open_checkpoint(make_checkpoint(tmp_path))
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: missing"):
        checkpoint.tokenizer()
    (tmp_path / "tokenizer.json").write_text('{"model": 3}')
    with pytest.raises(CheckpointError) as caught:
        checkpoint.tokenizer()
    assert str(tmp_path / "tokenizer.json") in str(caught.value)


def test_eos_ids_come_from_generation_config_first_then_config(tmp_path: Path) -> None:
    config = {"model_type": "qwen3_next", "eos_token_id": 5}
    assert open_checkpoint(make_checkpoint(tmp_path, config=config)).eos_ids == (5,)
    write_json(tmp_path / "generation_config.json", {"eos_token_id": [151645, 151643]})
    assert open_checkpoint(tmp_path).eos_ids == (151645, 151643)
    write_json(tmp_path / "generation_config.json", {"do_sample": True})
    assert open_checkpoint(tmp_path).eos_ids == (5,)
    assert open_checkpoint(make_checkpoint(tmp_path / "none")).eos_ids == ()

"""A checkpoint's quantization_config: block-wise FP8 as Qwen publishes it read, anything else refused
by the field at fault, on opening the checkpoint; the modules it converts matched as transformers
matches them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from checkpoint_files import make_checkpoint

from tfd.checkpoint import CheckpointError, open_checkpoint
from tfd.quantization import BlockFp8, QuantizationRefused, read_quantization

QWEN_FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "weight_block_size": [128, 128],
            "modules_to_not_convert": ["lm_head", "model.embed_tokens", "mlp.gate", "mlp.shared_expert_gate",
                                       "linear_attn.in_proj_ba", "model.layers.1"]}


def test_no_quantization_config_is_none() -> None:
    assert read_quantization({"model_type": "qwen3_next"}) is None
    assert read_quantization({"quantization_config": None}) is None


def test_qwens_fp8_config_is_read_with_the_modules_it_keeps() -> None:
    found = read_quantization({"quantization_config": QWEN_FP8})
    assert found == BlockFp8(tuple(QWEN_FP8["modules_to_not_convert"]))  # type: ignore[arg-type]
    # the fields transformers defaults: absent, and written out as it writes them
    assert read_quantization({"quantization_config": {"quant_method": "fp8"}}) == BlockFp8()
    both = {**QWEN_FP8, "scale_fmt": "float", "expert_dtype": "fp8", "ignored_layers": ["fc"]}
    assert read_quantization({"quantization_config": both}).kept[-1] == "fc"  # type: ignore[union-attr]


@pytest.mark.parametrize(("field", "value"), [
    ("quant_method", "awq"), ("quant_method", "compressed-tensors"), ("fmt", "e5m2"),
    ("weight_block_size", [64, 64]), ("weight_block_size", [128]), ("weight_block_size", [128, 64]),
    ("weight_block_size", None), ("activation_scheme", "static"), ("scale_fmt", "ue8m0"),
    ("expert_dtype", "fp4"), ("bits", 4)])
def test_anything_else_is_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(QuantizationRefused, match=rf"quantization_config\.{field}\b"):
        read_quantization({"quantization_config": {**QWEN_FP8, field: value}})


@pytest.mark.parametrize("patterns", ["lm_head", ["lm_head", 3], [""], ["layers.(1"]])
def test_kept_modules_must_be_names_transformers_can_match(patterns: object) -> None:
    with pytest.raises(QuantizationRefused, match=r"quantization_config\.modules_to_not_convert"):
        read_quantization({"quantization_config": {**QWEN_FP8, "modules_to_not_convert": patterns}})


def test_a_config_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(QuantizationRefused, match="quantization_config must be an object"):
        read_quantization({"quantization_config": ["fp8"]})


@pytest.mark.parametrize(("module", "converted"), [
    ("model.layers.0.mlp.gate", False), ("model.layers.0.mlp.gate_proj", True),  # a module's end
    ("model.layers.1.self_attn.q_proj", False), ("model.layers.11.self_attn.q_proj", True),  # its start
    ("lm_head", False), ("model.embed_tokens", False), ("model.layers.3.linear_attn.in_proj_ba", False),
    ("model.layers.3.linear_attn.in_proj_qkvz", True), ("model.layers.3.mlp.experts.7.down_proj", True),
    ("model.layers.3.mlp.shared_expert_gate", False), ("model.layers.3.mlp.shared_expert.up_proj", True)])
def test_modules_are_kept_as_transformers_keeps_them(module: str, converted: bool) -> None:
    found = read_quantization({"quantization_config": QWEN_FP8})
    assert found is not None and found.converted(module) is converted
    assert BlockFp8().converted(module)  # nothing kept: every linear converted
    transformers = pytest.importorskip("transformers.quantizers.quantizers_utils")
    assert transformers.should_convert_module(module, QWEN_FP8["modules_to_not_convert"]) is converted


def test_a_checkpoint_with_a_config_tfd_does_not_serve_is_refused_on_opening(tmp_path: Path) -> None:
    config = {"model_type": "qwen3_next", "quantization_config": {**QWEN_FP8, "fmt": "e5m2"}}
    with pytest.raises(CheckpointError) as caught:
        open_checkpoint(make_checkpoint(tmp_path, config=config))
    assert str(tmp_path / "config.json") in str(caught.value)
    assert "quantization_config.fmt is 'e5m2'" in str(caught.value)


def test_an_fp8_checkpoints_config_is_read_on_opening(tmp_path: Path) -> None:
    config = {"model_type": "qwen3_next", "quantization_config": QWEN_FP8}
    found = open_checkpoint(make_checkpoint(tmp_path, config=config)).config.quantization
    assert found is not None and not found.converted("lm_head")
    assert open_checkpoint(make_checkpoint(tmp_path / "plain")).config.quantization is None


def test_an_fp8_checkpoint_is_refused_at_load_until_tfd_loads_its_weights(tmp_path: Path) -> None:
    # its format is read and checked on opening; loading its weights is what comes next (issue 34)
    import torch
    import transformers

    from tfd.env import Table
    from tfd.models import load

    config = transformers.Qwen3_5TextConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, intermediate_size=48, linear_num_key_heads=1, linear_num_value_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=8)
    transformers.Qwen3_5ForCausalLM(config).save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**written, "quantization_config": QWEN_FP8}))
    environ = {"TF_MODEL": str(tmp_path)}
    settings = Table.load().read(environ)
    with pytest.raises(CheckpointError, match="block-wise FP8 weights are not loaded by this tfd yet"):
        load(settings, environ, torch.device("cpu"))

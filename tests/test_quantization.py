"""A checkpoint's quantization_config: block-wise FP8 as Qwen publishes it read, anything else refused
by the field at fault, on opening the checkpoint; the modules it converts matched as transformers
matches them."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import attrs
import pytest
import safetensors.torch
import torch
from checkpoint_files import make_checkpoint

from tfd.checkpoint import Checkpoint, CheckpointError, TensorSpec, open_checkpoint
from tfd.quantization import BlockFp8, QuantizationRefused, read_quantization, report

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


def test_an_fp8_checkpoint_is_refused_on_a_device_without_fp8_products(tmp_path: Path) -> None:
    # read on opening, refused before any weight loads where no FP8 product runs
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
    with pytest.raises(CheckpointError, match="FP8 weights run on the CPU and CUDA only"):
        load(settings, environ, torch.device("meta"))


# -- FP8 tensors in a checkpoint's headers --------------------------------------------------------

def fp8_checkpoint(directory: Path, tensors: dict[str, torch.Tensor], quantized: bool = True,
                   kept: list[str] | None = None) -> Checkpoint:
    directory.mkdir(parents=True, exist_ok=True)
    config: dict[str, object] = {"model_type": "qwen3_next"}
    if quantized:
        config["quantization_config"] = QWEN_FP8 if kept is None else \
            {**QWEN_FP8, "modules_to_not_convert": kept}
    (directory / "config.json").write_text(json.dumps(config))
    safetensors.torch.save_file(tensors, directory / "model.safetensors")
    return open_checkpoint(directory)


def fp8(out: int, inp: int, *lead: int) -> torch.Tensor:
    return torch.randn(*lead, out, inp).to(torch.float8_e4m3fn)


def scales(out: int, inp: int, *lead: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.rand(*lead, -(-out // 128), -(-inp // 128)).to(dtype)


def problems(checkpoint: Checkpoint, specs: dict[str, tuple[int, ...]]) -> str:
    try:
        checkpoint.check({name: TensorSpec(shape) for name, shape in specs.items()})
    except CheckpointError as error:
        return str(error)
    return ""


@pytest.mark.parametrize(("out", "inp"), [(128, 128), (129, 256), (256, 257), (1, 1)])
def test_an_fp8_weight_beside_its_block_scales_fits(tmp_path: Path, out: int, inp: int) -> None:
    name = "model.layers.0.mlp.down_proj.weight"
    checkpoint = fp8_checkpoint(tmp_path, {name: fp8(out, inp), name + "_scale_inv": scales(out, inp)})
    assert problems(checkpoint, {name: (out, inp)}) == ""
    experts = "model.layers.0.mlp.experts.down_proj"  # fused experts: a scale grid an expert
    stacked = fp8_checkpoint(tmp_path / "stacked", {experts: fp8(out, inp, 3),
                                                    experts + "_scale_inv": scales(out, inp, 3)})
    assert problems(stacked, {experts: (3, out, inp)}) == ""


@pytest.mark.parametrize(("out", "inp", "wrong"), [(128, 128, (2, 1)), (129, 128, (1, 1)), (128, 257, (1, 2)),
                                                   (256, 256, (2, 2, 1))])
def test_scales_of_another_shape_are_named_with_the_expected_one(tmp_path: Path, out: int, inp: int,
                                                                 wrong: tuple[int, ...]) -> None:
    name = "model.layers.0.mlp.up_proj.weight"
    checkpoint = fp8_checkpoint(tmp_path, {name: fp8(out, inp), name + "_scale_inv": torch.ones(wrong)})
    expected = [-(-out // 128), -(-inp // 128)]
    found = problems(checkpoint, {name: (out, inp)})
    assert f"{name}_scale_inv: shape {list(wrong)}, expected {expected}" in found


def test_whats_wrong_with_an_fp8_tensor_is_named(tmp_path: Path) -> None:
    kept, weight = "model.layers.1.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"
    tensors = {weight: fp8(8, 8), kept: fp8(8, 8), kept + "_scale_inv": scales(8, 8),
               "model.layers.0.mlp.gate_proj.weight": fp8(8, 8),
               "model.layers.0.mlp.gate_proj.weight_scale_inv": scales(8, 8, dtype=torch.float16),
               "model.norm.weight": torch.ones(8).to(torch.float8_e4m3fn)}
    found = problems(fp8_checkpoint(tmp_path, tensors), {name: tuple(t.shape) for name, t in tensors.items()
                                                          if not name.endswith("_scale_inv")})
    assert f"{weight}_scale_inv: missing (the block scales of the FP8 {weight})" in found
    assert f"{kept}: stored in F8_E4M3, but quantization_config keeps model.layers.1" in found
    assert "model.layers.0.mlp.gate_proj.weight_scale_inv: dtype F16, expected BF16 or F32" in found
    assert "model.norm.weight: stored in F8_E4M3, which only a linear layer's weight or fused experts' may " \
           "be" in found
    # fused experts are the experts module's (kept whole or not), and 3-D; a 3-D ``.weight`` is no linear's
    fused, wide = "model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.shared_expert.up_proj.weight"
    odd = {fused: fp8(8, 8, 2), fused + "_scale_inv": scales(8, 8, 2), wide: fp8(8, 8, 2),
           wide + "_scale_inv": scales(8, 8, 2)}
    found = problems(fp8_checkpoint(tmp_path / "odd", odd, kept=["mlp.experts"]),
                     {fused: (2, 8, 8), wide: (2, 8, 8)})
    assert f"{fused}: stored in F8_E4M3, but quantization_config keeps model.layers.0.mlp.experts" in found
    assert f"{wide}: stored in F8_E4M3, which only a linear layer's weight or fused experts' may be" in found
    plain = fp8_checkpoint(tmp_path / "plain", {weight: fp8(8, 8), weight + "_scale_inv": scales(8, 8)},
                           quantized=False)
    assert "no quantization_config saying how to read it" in problems(plain, {weight: (8, 8)})


@pytest.mark.parametrize("stored", [torch.float32, torch.bfloat16])
def test_scales_load_as_float32_whatever_the_weights_dtype(tmp_path: Path, stored: torch.dtype) -> None:
    name = "model.layers.0.mlp.down_proj.weight"
    written = scales(300, 200, dtype=stored)
    checkpoint = fp8_checkpoint(tmp_path, {name: fp8(300, 200), name + "_scale_inv": written,
                                           "model.norm.weight": torch.full((4,), 1 / 3)})
    loaded = checkpoint.load([name, name + "_scale_inv", "model.norm.weight"], dtype=torch.bfloat16)
    assert loaded[name + "_scale_inv"].dtype == torch.float32
    assert torch.equal(loaded[name + "_scale_inv"], written.float())  # bf16 widens exactly
    assert loaded[name].dtype == torch.float8_e4m3fn  # FP8 values keep their dtype
    assert loaded["model.norm.weight"].dtype == torch.bfloat16  # the others take TF_DTYPE's


@attrs.frozen
class Header:
    dtype: str
    shape: tuple[int, ...]


def test_the_load_report_names_the_fp8_layers_and_the_bytes_saved() -> None:
    mib = 1 << 20  # a 1024 x 1024 FP8 weight: 1 MiB, and its 8 x 8 float32 scales 256 bytes
    fp8_weight = Header("F8_E4M3", (1024, 1024))
    headers = {f"model.layers.{i}.mlp.down_proj.weight": fp8_weight for i in (1, 2, 3, 5)}
    headers |= {f"{name}_scale_inv": Header("F32", (8, 8)) for name in list(headers)}
    headers["mtp.layers.0.mlp.down_proj.weight"] = fp8_weight  # the head's, not the trunk's layer 0
    headers["mtp.layers.0.mlp.down_proj.weight_scale_inv"] = Header("BF16", (8, 8))  # 128 bytes
    headers["model.layers.4.mlp.down_proj.weight"] = Header("BF16", (1024, 1024))  # kept: not counted
    scales, gib = 4 * 256 + 128, 2**30
    assert report(headers) == (f"5 weights in FP8 (layers 1-3, 5 and mtp): {5 * mib / gib:.2f} GiB "
                               f"and {scales / gib:.3f} GiB of scales, {(5 * mib - scales) / gib:.2f} GiB "
                               f"less than in bf16")
    assert report({"model.norm.weight": Header("BF16", (8,))}) == "no FP8 weights"


def test_the_daemons_load_logs_the_report(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import tiny_models

    from tfd.env import Table
    from tfd.models import load

    source = tiny_models.save_served("qwen3_5", tmp_path)
    tiny_models.fp8_copy(source, tmp_path / "fp8", lambda name: name.endswith("mlp.down_proj.weight"),
                         {**QWEN_FP8, "modules_to_not_convert": []})
    environ = {"TF_MODEL": str(tmp_path / "fp8")}
    with caplog.at_level(logging.INFO, logger="tfd"):
        load(Table.load().read(environ), environ, torch.device("cpu"))
    assert "block-wise FP8: 4 weights in FP8 (layers 0-3)" in caplog.text


def test_fp8_drawn_for_a_checkpoint_is_refused_naming_the_setting(tmp_path: Path) -> None:
    import tiny_models

    from tfd.env import SettingsRefused, Table
    from tfd.models import load

    environ = {"TF_MODEL": str(tiny_models.save_served("qwen3_5", tmp_path)), "TF_DTYPE": "fp8"}
    with pytest.raises(SettingsRefused, match=r"TF_DTYPE=fp8: draws a shape's weights in FP8 \(TF_SHAPE\)"):
        load(Table.load().read(environ), environ, torch.device("cpu"))

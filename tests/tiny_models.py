"""Tiny random checkpoints of every family, written by transformers itself.

Every parameter is randomised after transformers' init (its init leaves zero-centred norms and
the PLE conv at zero, which would leave those paths untested). Shapes are chosen so that value
heads outnumber key heads (GVA), the QSA budget is below the prompt lengths used, PLE is on, and
there are several residual streams.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tfd.demo import build_once

if TYPE_CHECKING:
    from tfd.model.fp8 import Fp8Experts, Fp8Weight

VOCAB = 320
EOS = 7
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
              linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
              max_position_embeddings=4096, eos_token_id=EOS,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                               "mrope_section": [2, 1, 1], "mrope_interleaved": True})
MOE = dict(moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2)
FAMILIES = ("qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen4_exp")
# twice the heads of every kind: counts 4 tensor-parallel ranks split (the tiny ones split into 2)
WIDE = dict(num_attention_heads=8, num_key_value_heads=4, linear_num_key_heads=4, linear_num_value_heads=8)
# heads of 128 and inner widths of 256: every FP8 weight's half is whole 128-wide scale blocks, so FP8
# checkpoints split over 2 ranks (the rotary part kept at 8 wide, as the tiny ones have it)
ALIGNED = dict(head_dim=128, linear_key_head_dim=128, linear_value_head_dim=128, intermediate_size=256,
               rope_parameters={**COMMON["rope_parameters"], "partial_rotary_factor": 0.0625})  # type: ignore[dict-item]


def make_model(family: str, seed: int = 0, vocab: int = VOCAB, eos: int = EOS, budget: int = 16,
               compress: int = 4, hidden: int = 64, flash: dict[str, object] | None = None,
               expert_inner: int = 32, wide: bool = False, dims: dict[str, object] | None = None
               ) -> torch.nn.Module:
    """``budget`` and ``compress``: qwen4_exp's QSA indexer budget (positions) and compress ratio;
    ``hidden``: the residual's width (a power of two fills a kernel's block, 80 does not); ``flash``:
    other qwen4_exp config fields over the tiny ones (residual streams, PLE layers, n-gram size...);
    ``expert_inner``: an MoE expert's inner width, and the shared expert's but at 32 (128: whole FP8
    blocks); ``wide``: ``WIDE``'s head counts; ``dims``: any other common config fields (``ALIGNED``)."""
    import transformers
    from transformers.models.qwen4_exp import Qwen4ExpForCausalLM, Qwen4ExpTextConfig

    common = {**COMMON, "vocab_size": vocab, "eos_token_id": eos, "hidden_size": hidden,
              **(WIDE if wide else {}), **(dims or {})}
    # experts of whole FP8 blocks have a shared expert of whole blocks too (as released shapes do)
    moe = {**MOE, "moe_intermediate_size": expert_inner,
           "shared_expert_intermediate_size": MOE["shared_expert_intermediate_size"] if expert_inner == 32
           else expert_inner}
    if family == "qwen3_5":
        config = transformers.Qwen3_5TextConfig(**{"intermediate_size": 96, **common})
        cls = transformers.Qwen3_5ForCausalLM
    elif family == "qwen3_5_moe":
        config = transformers.Qwen3_5MoeTextConfig(**moe, **common)
        cls = transformers.Qwen3_5MoeForCausalLM
    elif family == "qwen3_next":
        config = transformers.Qwen3NextConfig(**{"intermediate_size": 96, **moe, **common})
        cls = transformers.Qwen3NextForCausalLM
    elif family == "qwen4_exp":
        fields = dict(
            hc_count=4, hc_lowrank=16, ple_layer_ids=[2], ple_embed_dim=64,
            ngram_vocab_size_base=101, make_ngram_vocab_size_divisible_by=4, split_ngram_parts=1,
            heads_per_ngram=2, indexer_n_heads=8, indexer_kv_heads=1, indexer_head_dim=16,
            indexer_budget=budget, indexer_compress_ratio=compress, output_gate_type="sigmoid")
        config = Qwen4ExpTextConfig(**{**moe, **common, **fields, **(flash or {})})
        cls = Qwen4ExpForCausalLM
    else:
        raise ValueError(family)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(config).eval()
    randomise(model, seed)
    return model


def randomise(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not param.is_floating_point():
                continue
            if name.endswith("A_log"):
                param.copy_(torch.empty(param.shape).uniform_(0.0, 1.5, generator=generator))
            elif name.endswith("dt_bias"):
                param.copy_(torch.empty(param.shape).uniform_(-1.0, 1.0, generator=generator))
            elif name.endswith("linear_attn.norm.weight"):
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=generator))
            elif param.dim() == 1:
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
            elif "embed" in name:
                param.copy_(torch.randn(param.shape, generator=generator))
            else:
                fan_in = math.prod(param.shape[1:]) if param.dim() > 2 else param.shape[-1]
                if "conv1d" in name:
                    fan_in = param.shape[-1]
                param.copy_(torch.randn(param.shape, generator=generator) / math.sqrt(fan_in))


def save(family: str, directory: Path, seed: int = 0, budget: int = 16, compress: int = 4,
         hidden: int = 64, head: bool = False, flash: dict[str, object] | None = None,
         expert_inner: int = 32, wide: bool = False, aligned: bool = False) -> Path:
    """The tiny checkpoint of ``family`` under ``directory`` (``head``: with a random MTP head), built
    once: beside and renamed into place, since test processes running at once share the directory."""
    name = family if (budget, compress) == (16, 4) else f"{family}-qsa-{budget}-{compress}"
    name += "" if hidden == 64 else f"-hidden-{hidden}"
    name += "".join(f"-{key}-{value}" for key, value in sorted((flash or {}).items())).replace(" ", "")
    name += "-head" if head else ""
    name += "" if expert_inner == 32 else f"-experts-{expert_inner}"
    name += "-wide" if wide else ""
    name += "-aligned" if aligned else ""

    def fill(staging: Path) -> None:
        make_model(family, seed, budget=budget, compress=compress, hidden=hidden, flash=flash,
                   expert_inner=expert_inner, wide=wide, dims=ALIGNED if aligned else None
                   ).save_pretrained(staging)
        if head:
            add_head(staging, family)

    return build_once(directory / name, "config.json", fill)


def save_served(family: str, directory: Path, seed: int = 0, head: bool = False) -> Path:
    """A tiny checkpoint a server can serve: the demo's tokenizer, chat template and end tokens
    (``head``: with a random MTP head, so it drafts)."""
    import json
    import shutil

    from tfd.demo import ASSETS, ENDOFTEXT, IM_END, SPECIAL
    from tfd.demo import VOCAB as TOKENS

    def fill(staging: Path) -> None:
        make_model(family, seed, vocab=TOKENS, eos=ENDOFTEXT).save_pretrained(staging)
        if head:
            add_head(staging, family)
        shutil.copy(ASSETS / "demo_tokenizer.json", staging / "tokenizer.json")
        shutil.copy(ASSETS / "chat_template.jinja", staging / "chat_template.jinja")
        (staging / "tokenizer_config.json").write_text(json.dumps({"eos_token": SPECIAL[IM_END]}))
        (staging / "generation_config.json").write_text(json.dumps({"eos_token_id": [IM_END, ENDOFTEXT]}))

    return build_once(directory / f"{family}-served", "config.json", fill)


# the tokens Qwen3.5's tokenizer adds (not special to transformers, single tokens all the same)
QWEN_ADDED = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
QWEN_TEMPLATE = Path(__file__).resolve().parent / "assets" / "qwen3_5_chat_template.jinja"


def save_qwen_chat(directory: Path, head: bool = False) -> Path:
    """A tiny qwen3_5 checkpoint that chats as Qwen3.5 does: Qwen3.5's own chat template, the demo's
    tokenizer with the tokens Qwen3.5's adds (thinking and tool-call tags, one token each), its end
    tokens (``head``: with a random MTP head, so it drafts)."""
    import json
    import shutil

    import tokenizers

    from tfd.demo import ASSETS, ENDOFTEXT, IM_END, SPECIAL
    from tfd.demo import VOCAB as TOKENS

    def fill(staging: Path) -> None:
        tokenizer = tokenizers.Tokenizer.from_file(str(ASSETS / "demo_tokenizer.json"))
        tokenizer.add_tokens([tokenizers.AddedToken(text, special=False, normalized=False)
                              for text in QWEN_ADDED])
        make_model("qwen3_5", 0, vocab=tokenizer.get_vocab_size(), eos=ENDOFTEXT).save_pretrained(staging)
        if head:
            add_head(staging, "qwen3_5")
        tokenizer.save(str(staging / "tokenizer.json"))
        shutil.copy(QWEN_TEMPLATE, staging / "chat_template.jinja")
        (staging / "tokenizer_config.json").write_text(json.dumps({"eos_token": SPECIAL[IM_END]}))
        (staging / "generation_config.json").write_text(json.dumps({"eos_token_id": [IM_END, ENDOFTEXT]}))
        assert tokenizer.get_vocab_size() == TOKENS + len(QWEN_ADDED)

    return build_once(directory / ("qwen3_5-chat-head" if head else "qwen3_5-chat"), "config.json", fill)


def add_head(path: Path, family: str) -> None:
    """Random ``mtp.*`` tensors of the shapes the family expects, added to a saved checkpoint."""
    import json

    from safetensors.torch import load_file, save_file

    from tfd.families.hybrid import expected_tensors

    tensors = load_file(path / "model.safetensors")
    text = json.loads((path / "config.json").read_text())
    _, _, shapes = expected_tensors(family, text, set(tensors) | {"mtp.marker"})
    generator = torch.Generator().manual_seed(9)
    for name, shape in shapes.items():
        if name.startswith("mtp."):
            scale = 0.3 if len(shape) == 1 else 1 / math.sqrt(shape[-1])
            tensors[name] = torch.randn(shape, generator=generator) * scale
    save_file(tensors, path / "model.safetensors")


def save_sharded(family: str, directory: Path, shards: int = 2) -> Path:
    """The tiny served checkpoint of ``family`` with its tensors split over ``shards`` files and an
    index, as large checkpoints come."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    single = save_served(family, directory)

    def fill(path: Path) -> None:
        tensors = load_file(single / "model.safetensors")
        names = sorted(tensors)
        weight_map = {}
        for index in range(shards):
            file = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
            part = names[index::shards]
            save_file({name: tensors[name] for name in part}, path / file)
            weight_map.update(dict.fromkeys(part, file))
        index = {"metadata": {}, "weight_map": weight_map}
        (path / "model.safetensors.index.json").write_text(json.dumps(index))
        for item in single.iterdir():
            if item.name != "model.safetensors":
                shutil.copy(item, path / item.name)

    return build_once(directory / f"{family}-sharded-{shards}", "config.json", fill)


def save_with(model: torch.nn.Module, directory: Path, tensors: dict[str, torch.Tensor]) -> None:
    """``model``'s checkpoint files (its config, its generation config) with ``tensors`` as its
    weights instead of its own."""
    import safetensors.torch

    model.save_pretrained(directory)
    for written in directory.glob("*.safetensors"):
        written.unlink()
    safetensors.torch.save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})


def save_fp8(model: torch.nn.Module, directory: Path, converted: Callable[[str], bool],
             quantization: dict[str, object]) -> dict[str, Fp8Weight | Fp8Experts]:
    """``model`` written as Qwen's -FP8 releases are: each weight ``converted`` names in block-wise
    FP8 (``tfd.model.fp8.quantize_weight``) beside its ``_scale_inv``, the rest as they are, and
    ``quantization`` as config.json's quantization_config. The quantized weights, by name."""
    tensors, quantized = in_fp8(model.state_dict(), lambda name, _: converted(name))
    save_with(model, directory, tensors)
    say_quantized(directory, quantization)
    return quantized


def in_fp8(stored: Mapping[str, torch.Tensor], converted: Callable[[str, torch.Tensor], bool]
           ) -> tuple[dict[str, torch.Tensor], dict[str, Fp8Weight | Fp8Experts]]:
    """``stored`` as an -FP8 checkpoint's tensors: each 2- or 3-D one ``converted`` names in
    block-wise FP8 (``quantize_weight``, ``quantize_experts``) beside its ``_scale_inv``, the rest as
    they are; and the quantized weights, by name."""
    from tfd.model.fp8 import quantize_experts, quantize_weight

    tensors: dict[str, torch.Tensor] = {}
    quantized: dict[str, Fp8Weight | Fp8Experts] = {}
    for name, value in stored.items():
        if value.dim() in (2, 3) and converted(name, value):
            weight = quantize_weight(value) if value.dim() == 2 else quantize_experts(value)
            quantized[name] = weight
            tensors[name], tensors[name + "_scale_inv"] = weight.data, weight.scale_inv
        else:
            tensors[name] = value.contiguous()
    return tensors, quantized


def say_quantized(directory: Path, quantization: dict[str, object]) -> None:
    """``quantization`` as the quantization_config of the checkpoint's config.json."""
    import json

    settings = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**settings, "quantization_config": quantization}))


_EXPERT = re.compile(r"(.+\.experts)\.(\d+)\.(gate|up|down)_proj\.weight")


def fused_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` with experts stored one by one (``experts.{e}.gate_proj.weight``...) fused as
    transformers holds them: ``experts.gate_up_proj`` [experts, 2 * inner, hidden] (gate rows, then
    up rows) and ``experts.down_proj`` [experts, hidden, inner]."""
    found: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    fused = {}
    for name, value in tensors.items():
        match = _EXPERT.fullmatch(name)
        if match:
            found.setdefault(match[1], {}).setdefault(int(match[2]), {})[match[3]] = value
        else:
            fused[name] = value
    for at, experts in found.items():
        order = [experts[e] for e in sorted(experts)]
        fused[f"{at}.gate_up_proj"] = torch.stack([torch.cat((e["gate"], e["up"])) for e in order])
        fused[f"{at}.down_proj"] = torch.stack([e["down"] for e in order])
    return fused


def fp8_copy(source: Path, directory: Path, converted: Callable[[str], bool] | None,
             quantization: dict[str, object], fuse: bool = True) -> dict[str, torch.Tensor]:
    """The checkpoint at ``source`` copied to ``directory`` as Qwen's -FP8 releases store one: each
    tensor of 2 or 3 dimensions ``converted`` names (linear weights, fused experts; None: those Qwen's
    releases store in FP8, ``tfd.quantization.released_fp8``) in
    block-wise FP8 beside its ``_scale_inv`` (``tfd.model.fp8``), the rest as stored, ``fuse``: experts
    fused first (``fused_experts``). The tensors as quantized and dequantized, in fp32, by name: a
    float twin of the same weights."""
    import shutil

    import safetensors.torch

    from tfd.quantization import released_fp8

    shutil.copytree(source, directory, dirs_exist_ok=True)
    stored = safetensors.torch.load_file(source / "model.safetensors")
    stored = fused_experts(stored) if fuse else stored
    rule = (lambda name, value: released_fp8(name, tuple(value.shape))) if converted is None \
        else (lambda name, _: converted(name))
    tensors, quantized = in_fp8(stored, rule)
    safetensors.torch.save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    say_quantized(directory, quantization)
    return {name: quantized[name].dequantized(torch.float32) if name in quantized else tensors[name]
            for name in stored}


# transformers' quantization_config as Qwen's -FP8 releases write it (what they keep in bf16 named)
RELEASED_FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [128, 128],
                "modules_to_not_convert": ["lm_head", "embed_tokens", "ngram_embedding", "mlp.gate",
                                           "mlp.shared_expert_gate", "in_proj_b", "in_proj_a", "in_proj_ba"]}


def save_released_fp8(family: str, root: Path, aligned: bool = False) -> Path:
    """The family's tiny checkpoint with an MTP head in the -FP8 releases' format, built once under
    ``root``'s ``tiny-fp8`` (its float source under ``tiny-plain``, made only when the FP8 one is not
    there: the device, which has no transformers, is carried the FP8 ones). ``aligned``: heads of 128 and
    inner widths of 256 (every half whole blocks); else the tiny dims, experts of 128."""
    inner = 256 if aligned else 128
    name = f"{family}-experts-{inner}-head" + ("-aligned" if aligned else "")

    def fill(staging: Path) -> None:
        source = save(family, root / "tiny-plain", head=True, expert_inner=inner, aligned=aligned)
        fp8_copy(source, staging, None, RELEASED_FP8, fuse=False)

    return build_once(root / "tiny-fp8" / name, "config.json", fill)

"""A checkpoint's ``quantization_config``, read strictly: block-wise FP8 as Qwen publishes its ``-FP8``
checkpoints, or refused by the field at fault.

The one format: ``quant_method`` "fp8", ``fmt`` "e4m3", ``weight_block_size`` [128, 128],
``activation_scheme`` "dynamic" (activations quantized when used, per token); optionally
``modules_to_not_convert`` (transformers' name) or ``ignored_layers`` (SGLang's): the modules left in
the checkpoint's float dtype, matched as transformers matches them (``BlockFp8.converted``), and
``scale_fmt`` "float" / ``expert_dtype`` "fp8", the defaults transformers writes. A field absent
takes transformers' default, which is that format's. Any other value, or a field tfd does not know,
is refused (``QuantizationRefused``, naming ``quantization_config.<field>``): a field that changes
the weights' numbers is honoured or refused, never skipped. The tensors (``weight`` in e4m3 beside
its ``weight_scale_inv``) are the checkpoint's to check; this module reads the config alone.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Protocol

import attrs

BLOCK = (128, 128)
# each field: the values served; the first is transformers' default when the field is absent
SERVED: Mapping[str, tuple[object, ...]] = {
    "quant_method": ("fp8",), "fmt": ("e4m3",), "weight_block_size": ([128, 128],),
    "activation_scheme": ("dynamic",), "scale_fmt": ("float",), "expert_dtype": ("fp8",),
}
KEPT_FIELDS = ("modules_to_not_convert", "ignored_layers")  # the module patterns left unconverted
FP8 = "F8_E4M3"  # safetensors' name of a converted weight's dtype
SCALE_DTYPES = frozenset({"F32", "BF16"})  # a weight's scales: float32 as transformers writes, or bf16
SCALES = "_scale_inv"  # a converted ``x.weight``'s scales are ``x.weight_scale_inv``
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")  # the trunk's layer a tensor belongs to
_FUSED_EXPERTS = re.compile(r"\.experts\.(gate_up_proj|down_proj)$")  # [experts, out, in] in one tensor


class QuantizationRefused(ValueError):
    """A ``quantization_config`` tfd does not serve; the message names the field."""


@attrs.frozen
class BlockFp8:
    """Block-wise FP8 weights (e4m3, 128x128 blocks, dynamic activations); ``kept``: the module
    patterns left unconverted."""

    kept: tuple[str, ...] = ()

    def converted(self, module: str) -> bool:
        """Whether the linear module ``module`` (its dotted name, without ``.weight``) is stored in
        FP8: not when a kept pattern matches it from its start to a module boundary (as a regular
        expression: "layers.1" matches "layers.1.mlp", not "layers.11.mlp"; "mlp.gate" not
        "mlp.gate_proj"), nor when the name ends with one (transformers' rule)."""
        boundary = r"(?:(?<=\.)|(?=\.|$))"
        return not any(re.match(rf"(?:{pattern}){boundary}", module) or module.endswith(pattern)
                       for pattern in self.kept)


# what Qwen's -FP8 releases keep in bf16 besides embeddings and norms: the head, the router and the shared
# expert's gate, a GDN layer's b and a rows (and Flash Next's n-gram table, an embedding)
RELEASE = BlockFp8(("lm_head", "embed_tokens", "ngram_embedding", "mlp.gate", "mlp.shared_expert_gate",
                    "in_proj_b", "in_proj_a", "in_proj_ba"))


def read_quantization(config: Mapping[str, object]) -> BlockFp8 | None:
    """The quantization of a checkpoint whose config.json is ``config`` (its top level, where
    transformers writes ``quantization_config``): None without one. ``QuantizationRefused`` naming
    the field for anything but block-wise FP8 as described above."""
    found = config.get("quantization_config")
    if found is None:
        return None
    if not isinstance(found, dict):
        raise QuantizationRefused(f"quantization_config must be an object, not {type(found).__name__}")
    for field, value in found.items():
        if field in KEPT_FIELDS:
            continue
        if field not in SERVED:
            raise QuantizationRefused(f"quantization_config.{field} is not known to tfd, which serves "
                                      f"block-wise FP8 ({_described()}) and nothing else")
        if value not in SERVED[field]:
            raise QuantizationRefused(f"quantization_config.{field} is {value!r}; tfd serves "
                                      f"{' or '.join(map(repr, SERVED[field]))} ({_described()})")
    kept: list[str] = []
    for field in KEPT_FIELDS:
        patterns = found.get(field)
        if patterns is None:
            continue
        if not isinstance(patterns, list) or not all(isinstance(p, str) and p for p in patterns):
            raise QuantizationRefused(f"quantization_config.{field} must be a list of module names")
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as error:
                raise QuantizationRefused(f"quantization_config.{field}: {pattern!r} is not a pattern "
                                          f"transformers can match: {error}") from None
        kept += patterns
    return BlockFp8(tuple(kept))


def _described() -> str:
    return "quant_method 'fp8', fmt 'e4m3', weight_block_size [128, 128], activation_scheme 'dynamic'"


class Header(Protocol):
    """What ``fp8_problems`` reads of a tensor's safetensors header."""

    @property
    def dtype(self) -> str: ...

    @property
    def shape(self) -> tuple[int, ...]: ...


def released_fp8(name: str, shape: tuple[int, ...]) -> bool:
    """Whether Qwen's -FP8 releases store tensor ``name`` of ``shape`` in FP8: a linear weight [out,
    in] or fused experts [experts, out, in], except the modules ``RELEASE_KEPT`` keeps (transformers'
    rule) and the embeddings. What random FP8 weights at a shape follow (``TF_DTYPE=fp8``)."""
    fused = _FUSED_EXPERTS.search(name)
    if fused and len(shape) == 3:
        return RELEASE.converted(name[:fused.start()] + ".experts")
    return len(shape) == 2 and name.endswith(".weight") and ".ngram_embedding." not in name \
        and RELEASE.converted(name.removesuffix(".weight"))


def fp8_bytes(shape: tuple[int, ...]) -> int:
    """Bytes of an FP8 weight of ``shape`` with its float32 block scales."""
    *lead, rows, columns = shape
    return math.prod(shape) + 4 * math.prod(lead) * -(-rows // BLOCK[0]) * -(-columns // BLOCK[1])


def report(headers: Mapping[str, Header]) -> str:
    """One line for the load log: which layers hold FP8 weights and the bytes saved against the same
    weights in bf16 (the scales counted against it), from every tensor's header."""
    fp8 = {name: math.prod(header.shape) for name, header in headers.items() if header.dtype == FP8}
    if not fp8:
        return "no FP8 weights"
    scales = sum(math.prod(found.shape) * (4 if found.dtype == "F32" else 2)
                 for name in fp8 if (found := headers.get(scales_of(name))) is not None)
    trunk = [name for name in fp8 if not name.startswith("mtp.")]  # the MTP head has layers of its own
    layers = sorted({int(match[1]) for name in trunk if (match := _LAYER.search(name))})
    where = [f"layers {_ranges(layers)}"] if layers else []
    where += ["mtp"] if len(trunk) < len(fp8) else []
    elements = sum(fp8.values())
    return (f"{len(fp8)} weights in FP8 ({' and '.join(where) or 'outside the layers'}): "
            f"{elements / 2**30:.2f} GiB and {scales / 2**30:.3f} GiB of scales, "
            f"{(elements - scales) / 2**30:.2f} GiB less than in bf16")


def _ranges(numbers: list[int]) -> str:
    """Sorted ``numbers`` as runs: "0-3, 5, 7-9"."""
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][-1] + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def scales_of(weight: str) -> str:
    """The name of the FP8 weight ``weight``'s block scales."""
    return weight + SCALES


def fp8_problems(quantization: BlockFp8 | None, name: str, headers: Mapping[str, Header]) -> list[str]:
    """What is wrong with ``name``, stored in FP8, by ``headers`` (every tensor's): nothing when it is
    a linear weight [out, in] or fused experts' [experts, out, in] (``experts.gate_up_proj``,
    ``experts.down_proj``) that ``quantization`` converts, beside its scales [..., ceil(out/128),
    ceil(in/128)] in float32 or bf16; else a line a problem, naming the tensor."""
    shape = headers[name].shape
    if quantization is None:
        return [f"{name}: dtype {FP8}, but config.json has no quantization_config saying how to read it"]
    fused = _FUSED_EXPERTS.search(name)
    if fused and len(shape) == 3:  # transformers' FP8Experts: the module is the experts
        module = name[:fused.start()] + ".experts"
    elif name.endswith(".weight") and len(shape) == 2:
        module = name.removesuffix(".weight")
    else:
        return [f"{name}: stored in {FP8}, which only a linear layer's weight or fused experts' may be"]
    if not quantization.converted(module):
        return [f"{name}: stored in {FP8}, but quantization_config keeps {module} unconverted"]
    scales = headers.get(scales_of(name))
    if scales is None:
        return [f"{scales_of(name)}: missing (the block scales of the FP8 {name})"]
    problems = []
    rows, columns = shape[-2:]
    expected = (*shape[:-2], -(-rows // BLOCK[0]), -(-columns // BLOCK[1]))
    if tuple(scales.shape) != expected:
        problems.append(f"{scales_of(name)}: shape {list(scales.shape)}, expected {list(expected)} (a "
                        f"scale a {BLOCK[0]}x{BLOCK[1]} block of {name} {list(shape)})")
    if scales.dtype not in SCALE_DTYPES:
        allowed = " or ".join(sorted(SCALE_DTYPES))
        problems.append(f"{scales_of(name)}: dtype {scales.dtype}, expected {allowed}")
    return problems


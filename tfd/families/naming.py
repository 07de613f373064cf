"""Where a family's tensors sit in one checkpoint, and the layer records built from them.

Checkpoints put the trunk under ``model.`` (text-only) or ``model.language_model.`` (multimodal)
and may store MoE experts fused (``experts.gate_up_proj``) or one by one
(``experts.{e}.gate_proj.weight``); the MTP head lives at the top level under ``mtp.``. ``Naming``
finds both from the tensor names; the builders here read through it, so the families describe a
layer once, whatever the layout.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from typing import Protocol

import attrs
import torch

from tfd.checkpoint import CheckpointError
from tfd.families.config import HybridConfig
from tfd.model.attention import AttentionWeights
from tfd.model.fp8 import Experts, Fp8Experts, Fp8Weight, Part, join, stacked
from tfd.model.gdn import GdnWeights
from tfd.model.mlp import DenseMlp, MoeWeights, paired
from tfd.quantization import scales_of

Shape = tuple[int, ...]
_SHARD = re.compile(r"(.+)\.shard_(\d+)\.weight")
FP8_DTYPE = torch.float8_e4m3fn


class Get(Protocol):
    """A family's tensors by checkpoint name: ``get(name)`` a tensor; ``get.linear(name)`` a linear
    layer's weight, block-wise FP8 (``Fp8Weight``) where the checkpoint stores it so;
    ``get.stacked(name)`` fused experts' weights [experts, out, in], ``Fp8Experts`` where FP8."""

    def __call__(self, name: str) -> torch.Tensor: ...

    def linear(self, name: str) -> Part: ...

    def stacked(self, name: str) -> Experts: ...


@attrs.frozen
class Named:
    """``Get`` over ``tensor`` (a name's tensor, as loaded): an FP8 tensor is read only as a linear
    weight or stacked experts, with its ``_scale_inv`` beside it; asked for as a plain tensor (an
    embedding, a norm, a conv) it is a ``CheckpointError`` naming it."""

    tensor: Callable[[str], torch.Tensor]

    def __call__(self, name: str) -> torch.Tensor:
        found = self.tensor(name)
        if found.dtype == FP8_DTYPE:
            raise CheckpointError(f"{name}: stored in FP8, which tfd reads for linear layers' weights only")
        return found

    def linear(self, name: str) -> Part:
        found = self.tensor(name)
        return Fp8Weight(found, self.tensor(scales_of(name))) if found.dtype == FP8_DTYPE else found

    def stacked(self, name: str) -> Experts:
        found = self.tensor(name)
        return Fp8Experts(found, self.tensor(scales_of(name))) if found.dtype == FP8_DTYPE else found


@attrs.frozen
class Naming:
    trunk: str  # prefix of the trunk's names
    names: frozenset[str] = attrs.field(repr=False)
    shards: Mapping[str, int] = attrs.field(factory=dict)  # tensors stored in numbered shards

    @classmethod
    def of(cls, names: Collection[str]) -> Naming:
        trunk = "model.language_model." if any(n.startswith("model.language_model.") for n in names) \
            else "model."
        shards: dict[str, int] = {}
        for name in names:
            found = _SHARD.fullmatch(name)
            if found:
                shards[found[1]] = max(shards.get(found[1], 0), int(found[2]) + 1)
        return cls(trunk, frozenset(names), shards)

    def joined(self) -> dict[str, list[str]]:
        """Each table stored in numbered shards: its one name, and its shards' names in order."""
        return {f"{prefix}.weight": [f"{prefix}.shard_{j}.weight" for j in range(count)]
                for prefix, count in self.shards.items()}

    def fused_experts(self, at: str) -> bool:
        """Whether the MoE at ``at`` stores its experts fused (each MoE may differ: an MTP head's
        experts have been seen one by one beside a fused trunk)."""
        return f"{at}.experts.0.gate_proj.weight" not in self.names

    @property
    def has_mtp(self) -> bool:
        return any(name.startswith("mtp.") for name in self.names)


class Expect:
    """Collects the float tensors a model needs, by checkpoint name, with their shapes."""

    def __init__(self, naming: Naming) -> None:
        self.naming = naming
        self.shapes: dict[str, Shape] = {}

    def add(self, name: str, *shape: int) -> None:
        self.shapes[name] = shape

    def gdn_projections(self, cfg: HybridConfig, at: str) -> None:
        """The input projections of a GDN layer as Qwen3.5 stores them."""
        kv = 2 * cfg.key_heads * cfg.key_dim + cfg.value_heads * cfg.value_dim
        self.add(f"{at}.in_proj_qkv.weight", kv, cfg.hidden)
        self.add(f"{at}.in_proj_z.weight", cfg.value_heads * cfg.value_dim, cfg.hidden)
        self.add(f"{at}.in_proj_b.weight", cfg.value_heads, cfg.hidden)
        self.add(f"{at}.in_proj_a.weight", cfg.value_heads, cfg.hidden)

    def gdn(self, cfg: HybridConfig, at: str) -> None:
        channels = 2 * cfg.key_heads * cfg.key_dim + cfg.value_heads * cfg.value_dim
        self.add(f"{at}.conv1d.weight", channels, 1, cfg.conv_kernel)
        self.add(f"{at}.A_log", cfg.value_heads)
        self.add(f"{at}.dt_bias", cfg.value_heads)
        self.add(f"{at}.norm.weight", cfg.value_dim)
        self.add(f"{at}.out_proj.weight", cfg.hidden, cfg.value_heads * cfg.value_dim)

    def attention(self, cfg: HybridConfig, at: str, width: int) -> None:
        d = cfg.head_dim
        self.add(f"{at}.q_proj.weight", cfg.heads * 2 * d, width)
        self.add(f"{at}.k_proj.weight", cfg.kv_heads * d, width)
        self.add(f"{at}.v_proj.weight", cfg.kv_heads * d, width)
        self.add(f"{at}.o_proj.weight", width, cfg.heads * d)
        self.add(f"{at}.q_norm.weight", d)
        self.add(f"{at}.k_norm.weight", d)

    def dense(self, at: str, width: int, inner: int) -> None:
        self.add(f"{at}.gate_proj.weight", inner, width)
        self.add(f"{at}.up_proj.weight", inner, width)
        self.add(f"{at}.down_proj.weight", width, inner)

    def moe(self, cfg: HybridConfig, at: str) -> None:
        h, e, inner = cfg.hidden, cfg.experts, cfg.expert_inner
        self.add(f"{at}.gate.weight", e, h)
        if self.naming.fused_experts(at):
            self.add(f"{at}.experts.gate_up_proj", e, 2 * inner, h)
            self.add(f"{at}.experts.down_proj", e, h, inner)
        else:
            for expert in range(e):
                self.dense(f"{at}.experts.{expert}", h, inner)
        self.dense(f"{at}.shared_expert", h, cfg.shared_inner)
        self.add(f"{at}.shared_expert_gate.weight", 1, h)


def gdn_projections(get: Get, at: str) -> tuple[Part, Part, Part, Part]:
    """(qkv, z, b, a) of a GDN layer stored as Qwen3.5 stores them."""
    return (get.linear(f"{at}.in_proj_qkv.weight"), get.linear(f"{at}.in_proj_z.weight"),
            get.linear(f"{at}.in_proj_b.weight"), get.linear(f"{at}.in_proj_a.weight"))


def gdn_weights(cfg: HybridConfig, get: Get, at: str, qkv: Part, z: Part, b: Part, a: Part) -> GdnWeights:
    """The layer with its four input projections as one matrix, [qkv | z | b | a] (one product)."""
    return GdnWeights(
        proj=join((qkv, z, b, a)), conv=get(f"{at}.conv1d.weight")[:, 0, :], a_log=get(f"{at}.A_log"),
        dt_bias=get(f"{at}.dt_bias"), norm=get(f"{at}.norm.weight"),
        out=get.linear(f"{at}.out_proj.weight"),
        key_heads=cfg.key_heads, value_heads=cfg.value_heads, key_dim=cfg.key_dim,
        value_dim=cfg.value_dim, activation=cfg.gate_activation, eps=cfg.eps)


def attention_weights(cfg: HybridConfig, get: Get, at: str) -> AttentionWeights:
    """The layer with q (and its gate), k and v as one matrix (one product)."""
    return AttentionWeights(
        qkv=join([get.linear(f"{at}.{name}_proj.weight") for name in "qkv"]),
        o=get.linear(f"{at}.o_proj.weight"), q_norm=get(f"{at}.q_norm.weight"),
        k_norm=get(f"{at}.k_norm.weight"),
        heads=cfg.heads, kv_heads=cfg.kv_heads, head_dim=cfg.head_dim, eps=cfg.eps)


def dense_weights(get: Get, at: str) -> DenseMlp:
    """gate and up as one matrix (one product), and down."""
    return DenseMlp(join((get.linear(f"{at}.gate_proj.weight"), get.linear(f"{at}.up_proj.weight"))),
                    get.linear(f"{at}.down_proj.weight"))


def ffn_weights(get: Get, at: str) -> DenseMlp:
    """A dense feed-forward block: ``dense_weights``, paired on CUDA."""
    return paired(dense_weights(get, at))


def moe_weights(cfg: HybridConfig, naming: Naming, get: Get, at: str) -> MoeWeights:
    """The routed experts stacked, the router with the shared gate's row last (one product), and the
    shared expert as stored (gate then up, never paired: on CUDA the grouped kernels read it in place)."""
    gate_up: Experts
    down: Experts
    if naming.fused_experts(at):
        gate_up, down = get.stacked(f"{at}.experts.gate_up_proj"), get.stacked(f"{at}.experts.down_proj")
    else:
        first, past = cfg.held_experts or (0, cfg.experts)
        experts = [dense_weights(get, f"{at}.experts.{e}") for e in range(first, past)]
        try:
            gate_up, down = stacked([x.gate_up for x in experts]), stacked([x.down for x in experts])
        except ValueError as error:
            raise CheckpointError(f"{at}.experts: {error}") from None
    router = join((get.linear(f"{at}.gate.weight"), get.linear(f"{at}.shared_expert_gate.weight")))
    shared = dense_weights(get, f"{at}.shared_expert")
    return MoeWeights(router=router, gate_up=gate_up, down=down, shared=shared, top_k=cfg.top_k,
                      norm_top_k=cfg.norm_top_k, first_expert=(cfg.held_experts or (0, 0))[0])

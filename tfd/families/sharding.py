"""A rank's share of a checkpoint under tensor parallelism (``tfd.model.parallel``): the rows and columns
of each tensor it holds, and the model's shape as that rank sees it.

Attention is split by heads (q with its gate, k and v by key-value heads, o by the same heads'
columns), GDN by key and value heads (a rank's value heads read its own key heads: value head j reads
key head j // ratio, so contiguous shares match), a dense MLP and each expert by inner width (gate and
up by rows, down by columns), the shared expert likewise; under expert parallel the routed experts
are placed whole instead, a contiguous share of them a rank, each rank adding only its own to a row's
sum (``MoeWeights.first_expert``). Embeddings, norms, the router, the shared
expert's gate and the MTP head's joining products are whole on every rank, and so are Flash Next's
QSA indexer (every rank selects the same positions), hyper-connections and PLE: their work is repeated
on each. Each rank's block outputs are then partial sums, added across the ranks once a block
(``StackWeights.reduce``).

What cannot split is refused by name before any weight is read (``refusals``): a head or inner count
the parallel size does not divide, and an FP8 weight whose shares would cut one of its 128-wide scale
blocks (``block_refusals``). An FP8 weight's scales ``X_scale_inv`` split with it, by its weight's rule
counted in blocks, so a rank's share is an FP8 weight of whole blocks with its own scales: a row's
quantized groups are the whole model's, and a column share's groups a subset of them.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import attrs
import torch

from tfd.families.config import HybridConfig
from tfd.families.naming import Get
from tfd.model.fp8 import BLOCK, Experts, Fp8Experts, Fp8Weight, Part
from tfd.model.parallel import Parallel
from tfd.quantization import SCALES

ROW = "TF_TENSOR_PARALLEL"


def refusals(cfg: HybridConfig, size: int, experts: bool = False) -> list[str]:
    """What stops ``cfg``'s model from splitting over ``size`` ranks (``experts``: the routed experts
    placed whole, a share a rank), each naming the count at fault."""
    if size == 1:
        return []
    counts = {"attention heads (num_attention_heads)": cfg.heads,
              "key-value heads (num_key_value_heads)": cfg.kv_heads,
              "GDN key heads (linear_num_key_heads)": cfg.key_heads,
              "GDN value heads (linear_num_value_heads)": cfg.value_heads}
    if cfg.intermediate:
        counts["MLP inner columns (intermediate_size)"] = cfg.intermediate
    if cfg.experts and experts:
        counts["routed experts (num_experts)"] = cfg.experts
    elif cfg.experts:
        counts["experts' inner columns (moe_intermediate_size)"] = cfg.expert_inner
    if cfg.experts:
        counts["shared expert's inner columns (shared_expert_intermediate_size)"] = cfg.shared_inner
    found = [f"{ROW}={size}: the {count} {what} do not split into {size}"
             for what, count in counts.items() if count % size]
    return found


def rank_config(cfg: HybridConfig, parallel: Parallel) -> HybridConfig:
    """``cfg`` as ``parallel.rank`` holds it: its share of every head and inner count, and under expert
    parallel its share of the routed experts, each whole."""
    size = parallel.size
    held = parallel.share(cfg.experts) if parallel.experts and cfg.experts else None
    return attrs.evolve(cfg, heads=cfg.heads // size, kv_heads=cfg.kv_heads // size,
                        key_heads=cfg.key_heads // size, value_heads=cfg.value_heads // size,
                        intermediate=None if cfg.intermediate is None else cfg.intermediate // size,
                        expert_inner=cfg.expert_inner if held else cfg.expert_inner // size,
                        shared_inner=cfg.shared_inner // size, held_experts=held)


def split(cfg: HybridConfig, name: str, shape: tuple[int, ...], experts: bool = False
          ) -> tuple[int, list[int]] | None:
    """How the tensor ``name`` of ``shape`` splits: (its dimension, the sections along it, each split
    into equal shares, a rank taking its share of every one); None: whole on every rank. ``experts``
    (expert parallel): fused experts split by expert, experts stored one by one whole (a rank reads
    only its own)."""
    if name.endswith(SCALES):  # an FP8 weight's block scales: its weight's rule, counted in blocks
        return _scale_split(cfg, name.removesuffix(SCALES), shape, experts)
    qk, v = cfg.key_heads * cfg.key_dim, cfg.value_heads * cfg.value_dim
    if name.endswith(("linear_attn.in_proj_qkv.weight", "linear_attn.conv1d.weight")):
        return 0, [qk, qk, v]  # [all q | all k | all v]
    if experts and name.endswith(("experts.gate_up_proj", "experts.down_proj")):
        return 0, [shape[0]]
    if experts and ".experts." in name:
        return None
    if name.endswith("experts.gate_up_proj"):  # [experts, gate rows | up rows, hidden]
        return 1, [shape[1] // 2, shape[1] // 2]
    if name.endswith("experts.down_proj"):
        return 2, [shape[2]]
    rows = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
            "linear_attn.in_proj_z.weight", "linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight",
            "linear_attn.A_log", "linear_attn.dt_bias", "linear_attn.in_proj_qkvz.weight",
            "linear_attn.in_proj_ba.weight", "gate_proj.weight", "up_proj.weight")
    if name.endswith(rows):  # Qwen3-Next's qkvz and ba are grouped by key head: a share is whole groups
        return 0, [shape[0]]
    if name.endswith(("self_attn.o_proj.weight", "linear_attn.out_proj.weight", "down_proj.weight")):
        return 1, [shape[1]]
    return None


def _scale_split(cfg: HybridConfig, weight: str, shape: tuple[int, ...], experts: bool
                 ) -> tuple[int, list[int]] | None:
    """The rule of ``weight``'s scales of ``shape`` (its last two dimensions in 128-wide blocks; a
    3-D one's first, the experts, not): the weight's rule with its sections in blocks. Exact where
    every share is whole blocks (``block_refusals``)."""
    blocked = len(shape) - 2
    rule = split(cfg, weight, tuple(n * BLOCK if d >= blocked else n for d, n in enumerate(shape)), experts)
    if rule is None or rule[0] < blocked:
        return rule
    return rule[0], [section // BLOCK for section in rule[1]]


def block_refusals(cfg: HybridConfig, shapes: dict[str, tuple[int, ...]], size: int, experts: bool,
                   fp8: Callable[[str, tuple[int, ...]], bool]) -> list[str]:
    """The FP8 weights among ``shapes`` (those ``fp8`` says are) whose shares over ``size`` ranks would
    cut a 128-wide scale block, each kind named once (its layer number left out)."""
    found: dict[str, str] = {}
    for name, shape in shapes.items():
        rule = split(cfg, name, shape, experts) if size > 1 and fp8(name, shape) else None
        if rule is None or (len(shape) == 3 and rule[0] == 0):  # whole, or whole experts
            continue
        cut = [section // size for section in rule[1] if section % (size * BLOCK)]
        if cut:
            kind = re.sub(r"\.(layers|experts)\.\d+\.", r".\1.N.", name)
            found.setdefault(kind, f"{ROW}={size}: {kind} {list(shape)} is FP8 and splits into shares of "
                                   f"{cut[0]} along dimension {rule[0]}, not whole {BLOCK}-wide scale blocks")
    return list(found.values())


def rank_shape(cfg: HybridConfig, name: str, shape: tuple[int, ...], parallel: Parallel) -> tuple[int, ...]:
    """The shape of ``parallel.rank``'s share of the tensor ``name`` of ``shape`` (``cfg``: the whole
    model's)."""
    rule = split(cfg, name, shape, parallel.experts)
    if rule is None:
        return shape
    dim, sections = rule
    return (*shape[:dim], sum(past - first for first, past in ranges(sections, parallel)), *shape[dim + 1:])


def ranges(sections: list[int], parallel: Parallel) -> list[tuple[int, int]]:
    """``parallel.rank``'s share of each section, as (first, past last) along the sections' dimension."""
    found, at = [], 0
    for size in sections:
        first, last = parallel.share(size)
        found.append((at + first, at + last))
        at += size
    return found


EXPERT = re.compile(r".*\.experts\.(\d+)\..*")


def read_by(cfg: HybridConfig, parallel: Parallel, name: str) -> bool:
    """Whether ``parallel.rank`` reads tensor ``name`` at all: under expert parallel, an expert stored
    one by one is read only by the rank that holds it."""
    found = EXPERT.fullmatch(name)
    if not parallel.experts or found is None or not cfg.experts:
        return True
    first, past = parallel.share(cfg.experts)
    return first <= int(found[1]) < past


Taken = tuple[int, list[tuple[int, int]]] | None  # a dimension and ranges along it; None: the whole


def taken(cfg: HybridConfig, parallel: Parallel) -> Callable[[str, tuple[int, ...]], Taken]:
    """What a rank reads of each stored tensor (``Checkpoint.load``'s ``take``): its share, or all."""
    def take(name: str, shape: tuple[int, ...]) -> Taken:
        rule = split(cfg, name, shape, parallel.experts)
        return None if rule is None else (rule[0], ranges(rule[1], parallel))

    return take


def share(tensor: torch.Tensor, dim: int, sections: list[int], parallel: Parallel) -> torch.Tensor:
    """``parallel.rank``'s share of each section of ``tensor`` along ``dim``, joined."""
    if sum(sections) != tensor.shape[dim]:
        raise ValueError(f"sections of {sum(sections)} along dimension {dim} of a tensor of shape "
                         f"{tuple(tensor.shape)}")
    pieces = [tensor.narrow(dim, first, past - first) for first, past in ranges(sections, parallel)]
    return torch.cat(pieces, dim).contiguous()


@attrs.frozen
class Sharded:
    """``Get`` over ``get`` giving ``parallel.rank``'s share of each tensor (``cfg``: the whole model's)."""

    get: Get
    cfg: HybridConfig
    parallel: Parallel

    def __call__(self, name: str) -> torch.Tensor:
        return self._share(name, self.get(name))

    def linear(self, name: str) -> Part:
        found = self.get.linear(name)
        if isinstance(found, Fp8Weight):  # the weight's share and its scales', in whole blocks
            return Fp8Weight(self._share(name, found.data), self._share(name + SCALES, found.scale_inv))
        if not isinstance(found, torch.Tensor):
            raise ValueError(f"{name}: a weight of parts cannot be split across ranks; serve {ROW}=1")
        return self._share(name, found)

    def stacked(self, name: str) -> Experts:
        found = self.get.stacked(name)
        if isinstance(found, Fp8Experts):
            return Fp8Experts(self._share(name, found.data), self._share(name + SCALES, found.scale_inv))
        return self._share(name, found)

    def _share(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        rule = split(self.cfg, name, tuple(tensor.shape), self.parallel.experts)
        return tensor if rule is None else share(tensor, *rule, self.parallel)

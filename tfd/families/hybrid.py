"""A loaded hybrid model: its shape, its weights, what a lane keeps, and the forward pass.

``HybridModel.forward`` is what the engine calls: several lanes' spans (prefill chunks, decoded
tokens) in one pass, each lane's state and rows reached through its pool views. The families
differ only in how checkpoint tensors become the shared layer records (``FAMILIES``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from types import ModuleType

import attrs
import torch

from tfd.checkpoint import Checkpoint, CheckpointError, TensorSpec
from tfd.families import qwen3_5, qwen3_next, qwen4_exp
from tfd.families.config import LINEAR, HybridConfig, read_config
from tfd.families.lane_state import AttentionRows, DraftBuffers, GdnLayers, PleState, lane_pieces
from tfd.families.naming import Get, Named, Naming, Shape
from tfd.families.random_weights import random_tensors
from tfd.families.sharding import Sharded, block_refusals, rank_config, read_by, refusals, taken
from tfd.model.decode import DecodeMemory, batches, run_decode, run_draft_rows, run_rows
from tfd.model.decode_batch import DecodeBatch, lane_fields
from tfd.model.gdn import GdnWeights
from tfd.model.memory import PageRows, Span
from tfd.model.mtp import Draft, MtpWeights, draft
from tfd.model.parallel import Parallel
from tfd.model.ple import ple_commit
from tfd.model.stack import StackOutput, StackWeights, logits, run_stack
from tfd.model.verify import VerifyLanes, commit
from tfd.pool.layout import Layout, RowPart
from tfd.pool.pieces import Piece
from tfd.quantization import FP8, SCALES, released_fp8, scales_of

FAMILIES: Mapping[str, ModuleType] = {
    "qwen3_5": qwen3_5, "qwen3_5_moe": qwen3_5, "qwen3_next": qwen3_next, "qwen4_exp": qwen4_exp,
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def expected_tensors(family: str, text_config: Mapping[str, object], names: Collection[str]
                     ) -> tuple[HybridConfig, Naming, dict[str, Shape]]:
    """The model's shape, where its tensors sit, and every float tensor it needs with its shape."""
    cfg = read_config(family, text_config)
    naming = Naming.of(names)
    return cfg, naming, FAMILIES[family].expect(cfg, naming)


def load_model(checkpoint: Checkpoint, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.bfloat16, progress: bool | None = None,
               parallel: Parallel | None = None) -> HybridModel:
    """The checkpoint's model on ``device`` in ``dtype``.

    Every tensor the family needs is checked against the headers first (``CheckpointError`` lists
    each missing or misshapen one); only then are weights read.
    """
    cfg, naming, shapes = expected_tensors(checkpoint.family, checkpoint.text_config, checkpoint.tensors)
    checkpoint.check({name: TensorSpec(shape) for name, shape in shapes.items()})
    # a weight stored in FP8 (the check found its scales beside it) is read with its scales
    scales = [scales_of(name) for name in shapes if checkpoint.tensors[name].dtype == FP8]
    take = None
    if parallel is not None and parallel.size > 1:  # a rank reads only its share of each tensor
        _refuse_split(cfg, parallel, shapes, lambda name, _: checkpoint.tensors[name].dtype == FP8)
        take = taken(cfg, parallel)
        shapes = {name: shape for name, shape in shapes.items() if read_by(cfg, parallel, name)}
    tensors = checkpoint.load([*shapes, *scales], device, dtype, progress, joined=naming.joined(), take=take)
    return HybridModel.build(cfg, naming, Named(tensors.__getitem__), dtype, parallel,
                             shared=take is not None)


def _refuse_split(cfg: HybridConfig, parallel: Parallel, shapes: dict[str, tuple[int, ...]] | None = None,
                  fp8: Callable[[str, tuple[int, ...]], bool] = lambda name, shape: False) -> None:
    """``CheckpointError`` naming each count ``parallel.size`` does not divide, and each kind of FP8
    weight among ``shapes`` (``fp8`` says which are) whose shares would cut a scale block."""
    problems = refusals(cfg, parallel.size, parallel.experts)
    problems += block_refusals(cfg, shapes or {}, parallel.size, parallel.experts, fp8)
    if problems:
        raise CheckpointError("; ".join(problems))


class HybridModel:
    """Weights on one device in one dtype; stateless between calls (state lives in the pool)."""

    def __init__(self, cfg: HybridConfig, weights: StackWeights, head: MtpWeights | None,
                 dtype: torch.dtype) -> None:
        self.cfg = cfg
        self.weights = weights
        self.head = head  # the MTP head, when the checkpoint has one
        self.dtype = dtype

    @classmethod
    def build(cls, cfg: HybridConfig, naming: Naming, get: Get, dtype: torch.dtype,
              parallel: Parallel | None = None, shared: bool = False) -> HybridModel:
        """The model from ``get``'s tensors; with ``parallel`` (tensor parallel), this rank's share of
        them (``tfd.families.sharding``; ``CheckpointError`` naming what does not split), its
        ``cfg`` the rank's; ``shared``: ``get`` gives the shares already (``load_model``)."""
        if parallel is not None and parallel.size > 1:
            _refuse_split(cfg, parallel)
            get = get if shared else Sharded(get, cfg, parallel)
            cfg = rank_config(cfg, parallel)
        stack, head = FAMILIES[cfg.family].build(cfg, naming, get)
        if parallel is not None and parallel.size > 1:
            stack = attrs.evolve(stack, parallel=parallel)
        return cls(cfg, stack, head, dtype)

    @classmethod
    def from_tensors(cls, family: str, text_config: Mapping[str, object],
                     tensors: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.float32,
                     device: torch.device | str = "cpu", parallel: Parallel | None = None) -> HybridModel:
        """From a state dict already in memory (tests, random weights)."""
        cfg, naming, shapes = expected_tensors(family, text_config, tensors.keys())
        missing = sorted(set(shapes) - set(tensors))
        if missing:
            raise KeyError(f"missing tensors: {', '.join(missing[:8])}")
        tensors = {**tensors, **{name: torch.cat([tensors[part] for part in parts])  # as the loader joins
                                 for name, parts in naming.joined().items()}}

        def get(name: str) -> torch.Tensor:
            tensor = tensors[name]
            return tensor.to(device=device, dtype=dtype if tensor.is_floating_point() else tensor.dtype)

        return cls.build(cfg, naming, Named(get), dtype, parallel)

    @classmethod
    def random(cls, family: str, text_config: Mapping[str, object], seed: int = 0,
               dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu",
               head: bool = False, fp8: bool = False, parallel: Parallel | None = None) -> HybridModel:
        """The config's shapes with random weights (``tfd.families.random_weights``); ``head``
        adds an MTP head; ``fp8``: the weights Qwen's -FP8 releases hold in FP8 drawn, then quantized."""
        cfg, naming, shapes = expected_tensors(family, text_config, {"mtp.head"} if head else set())
        if parallel is not None and parallel.size > 1:
            # each tensor drawn as one rank alone would draw it (an FP8 one quantized with its scales),
            # then cut to this rank's share: the whole model is never held at once (Qwen3-Next-80B-A3B
            # in bf16 is twice a card)
            _refuse_split(cfg, parallel, shapes, lambda name, shape: fp8 and released_fp8(name, shape))
            drawn: dict[str, torch.Tensor] = {}

            def draw(name: str) -> torch.Tensor:
                if name not in drawn:  # a weight's scales come from its own draw, asked for next
                    weight = name.removesuffix(SCALES)
                    drawn.clear()
                    drawn.update(random_tensors({weight: shapes[weight]}, seed, dtype, device, fp8))
                return drawn.pop(name)

            return cls.build(cfg, naming, Named(draw), dtype, parallel)
        tensors = random_tensors(shapes, seed, dtype, device, fp8)
        return cls.build(cfg, naming, Named(tensors.__getitem__), dtype, parallel)

    def attention_layers(self, head: bool = False) -> list[str]:
        """Layers with rows in the pool; ``head`` adds the MTP head's own."""
        names = [f"layer{i}" for i, kind in enumerate(self.cfg.layer_types) if kind != LINEAR]
        return [*names, "mtp"] if head else names

    def row_parts(self, head: bool = False) -> list[RowPart]:
        cfg = self.cfg
        if head and self.head is None:
            raise ValueError("this checkpoint has no MTP head")
        rows = AttentionRows(self.attention_layers(head), cfg.kv_heads, cfg.head_dim, dtype_name(self.dtype),
                             cfg.indexer.dim if cfg.indexer else None,
                             cfg.indexer.block if cfg.indexer else 4)
        return rows.parts()

    def gdn_layers(self) -> GdnLayers:
        cfg = self.cfg
        names = [f"layer{i}" for i, kind in enumerate(cfg.layer_types) if kind == LINEAR]
        return GdnLayers(names, cfg.key_heads, cfg.value_heads, cfg.key_dim, cfg.value_dim, cfg.conv_kernel,
                         dtype_name(self.dtype))

    def ple_state(self) -> PleState | None:
        ple = self.cfg.ple
        if ple is None:
            return None
        return PleState(self.cfg.streams * self.cfg.hidden, (ple.kernel - 1) * ple.ngram, ple.ngram - 1,
                        dtype_name(self.dtype))

    def pieces(self, drafts: DraftBuffers | None = None) -> list[Piece]:
        return lane_pieces(self.gdn_layers(), self.ple_state(), drafts)

    def draft_buffers(self, window: int) -> DraftBuffers:
        """What a lane needs to verify windows of ``window`` rows and roll back."""
        return DraftBuffers(window, self.gdn_layers(), self.cfg.streams * self.cfg.hidden, self.ple_state())

    def layout(self, page_rows: int, head: bool = False, window: int = 0) -> Layout:
        """The pool's geometry for this model; ``head`` makes room for the MTP head's rows, a
        ``window`` (rows a verify takes, 0: none) for verify's buffers."""
        return Layout(page_rows, self.row_parts(head),
                      self.pieces(self.draft_buffers(window) if window else None))

    def init_state(self, pieces: Mapping[str, torch.Tensor]) -> None:
        """A fresh lane: zero states and tails, and an n-gram history of EOS."""
        for view in pieces.values():
            view.zero_()
        self.nonzero_state(pieces)

    def nonzero_state(self, pieces: Mapping[str, torch.Tensor]) -> None:
        """What of a fresh lane's state is not zero, written into pieces that are (a lane's state
        pages as the pool opens them): an n-gram history of EOS."""
        if "ple.history" in pieces:
            pieces["ple.history"].fill_(self.cfg.eos[0])

    def forward(self, spans: Sequence[Span], rows: PageRows) -> StackOutput:
        """Run every span's rows; each lane's state and rows move past its span."""
        return run_stack(self.weights, spans, rows)

    @property
    def batches_decode(self) -> bool:
        """Whether decode rows of many lanes run as one batched pass (``decode``)."""
        return batches(self.weights)

    def decode(self, batch: DecodeBatch, memory: DecodeMemory) -> torch.Tensor:
        """One decode row per lane of ``batch``, all together: the final hidden rows."""
        return run_decode(self.weights, batch, memory)

    def verify(self, batch: DecodeBatch, memory: DecodeMemory, lanes: VerifyLanes) -> StackOutput:
        """Verify windows (``tfd.model.verify``): ``lanes.rows`` rows a lane of ``batch``, together;
        the final hidden rows and the residual. Each lane's state stays as committed until ``commit``."""
        return run_rows(self.weights, batch, memory, lanes)

    def commit(self, batch: DecodeBatch, memory: DecodeMemory, lanes: VerifyLanes, keep: torch.Tensor
               ) -> None:
        """After ``verify`` of ``batch``: each lane's state as serial decoding of its first ``keep``
        rows (int32 [lanes] on the device) leaves it."""
        gdn = [layer.mixer for layer in self.weights.layers if isinstance(layer.mixer, GdnWeights)]
        offsets = lanes.firsts(lane_fields(batch))
        layers = len(gdn)
        commit(gdn, lanes, keep, memory.states, offsets[:layers], memory.tails, offsets[layers:2 * layers])
        ple = next((layer.ple for layer in self.weights.layers if layer.ple is not None), None)
        if ple is not None:
            at = 2 * len(gdn)
            ple_commit(ple, batch.tokens.view(lanes.lanes, lanes.rows), keep, memory.tails, offsets[at],
                       memory.histories, offsets[at + 1], lanes.ple_rows_at)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return logits(self.weights, hidden)

    def draft(self, spans: Sequence[Span], previous: torch.Tensor, rows: PageRows) -> Draft:
        """MTP cells for ``spans`` (tokens x_{t+1} at positions t) from the main model's state
        ``previous``: ``StackOutput.hidden`` for Qwen3.5 and Qwen3-Next, ``.residual`` for Flash
        Next (see ``draft_input``), or a previous cell's ``carry``."""
        if self.head is None:
            raise ValueError("this checkpoint has no MTP head")
        return draft(self.weights, self.head, spans, previous, rows)

    def draft_rows(self, batch: DecodeBatch, memory: DecodeMemory, previous: torch.Tensor) -> Draft:
        """MTP cells as decode rows, a column of ``batch`` each (``decode.run_draft_rows``): what a
        captured verify round runs."""
        if self.head is None:
            raise ValueError("this checkpoint has no MTP head")
        return run_draft_rows(self.weights, self.head, batch, memory, previous)

    def draft_input(self, output: StackOutput) -> torch.Tensor:
        """What the MTP head reads of the main model's rows."""
        return output.residual if self.cfg.streams > 1 else output.hidden

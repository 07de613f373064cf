"""The decoder stack shared by the families: embed, layers, final norm or mixer, head.

Rows of several lanes are flattened into one ``[rows, width]`` residual. Row-wise work (norms,
projections, MLPs) runs on all rows at once; the token mixers (GDN, attention) run per lane span,
each on its own state and rows. Qwen3.5 and Qwen3-Next add each block to one residual between
RMSNorms; Flash Next keeps several residual streams joined by hyper-connections, adds PLE before
one layer, and mixes the streams for the head.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from tfd.model import hyper
from tfd.model.attention import AttentionWeights, attention, attention_spans
from tfd.model.fp8 import Experts, Weight
from tfd.model.gdn import GdnWeights, gdn, gdn_spans
from tfd.model.memory import LanesOnce, PageRows, PromptLanes, Span
from tfd.model.mlp import DenseMlp, MoeWeights, dense, moe, moe_add_zrms
from tfd.model.ops import add_zrms, linear, zrms
from tfd.model.parallel import Parallel
from tfd.model.ple import PleWeights, ple
from tfd.model.rope import Rotary


@attrs.frozen
class LayerWeights:
    """One decoder layer. ``name`` prefixes its pieces and row parts in the pool."""

    name: str
    mixer: GdnWeights | AttentionWeights
    ffn: DenseMlp | MoeWeights
    input_norm: torch.Tensor | None = None  # Qwen3.5 / Qwen3-Next residual
    post_norm: torch.Tensor | None = None
    attn_hyper: hyper.HyperWeights | None = None  # Flash Next residual streams
    mlp_hyper: hyper.HyperWeights | None = None
    ple: PleWeights | None = None


@attrs.frozen
class StackWeights:
    embed: torch.Tensor  # [vocab, width]
    layers: tuple[LayerWeights, ...]
    head: torch.Tensor  # [vocab, width]
    rotary: Rotary
    eps: float
    streams: int = 1  # residual streams: 1, or Flash Next's hc_count
    final_norm: torch.Tensor | None = None
    mixer: hyper.HyperWeights | None = None
    parallel: Parallel | None = None  # tensor parallel: the blocks' outputs are this rank's partials

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """A block's output: its partial summed over the ranks (``Parallel.reduce``), or as it is."""
        return partial if self.parallel is None else self.parallel.reduce(partial)


@attrs.frozen
class StackOutput:
    """The head's input per row, and the residual before the final norm or mixer (what an MTP
    head reads)."""

    hidden: torch.Tensor
    residual: torch.Tensor


def run_stack(w: StackWeights, spans: Sequence[Span], rows: PageRows) -> StackOutput:
    tokens = torch.cat([span.tokens for span in spans])
    x = w.embed[tokens]
    if w.streams > 1:
        x = x.repeat(1, w.streams)
    lanes = None
    if x.is_cuda and not any(span.decode for span in spans):  # prompt rows: layers take all lanes at once
        names = [layer.name for layer in w.layers if isinstance(layer.mixer, GdnWeights)]
        lanes = LanesOnce(spans, names, rows.buffer, rows.page_rows, rows.null_page, x.dtype)
    pending: Carried | None = None
    # each layer's FFN output added in the launch that makes the norm after it (none: streams)
    norms = [layer.input_norm for layer in w.layers[1:]] + [w.final_norm]
    for layer, then in zip(w.layers, norms, strict=True):
        x, pending = run_layer(w, layer, x, spans, rows, lanes, pending, then)
    if w.mixer is not None:
        assert not isinstance(pending, Fed | Normed)
        x, hidden, _ = hyper.read_after(w.mixer, x, pending)
    elif isinstance(pending, Normed):
        hidden = pending.values
    elif isinstance(pending, Fed):
        assert w.final_norm is not None
        x, hidden = add_zrms(x, pending.values, w.final_norm, w.eps)
    else:
        assert w.final_norm is not None
        hidden = zrms(x, w.final_norm, w.eps)
    return StackOutput(hidden, x)


def logits(w: StackWeights, hidden: torch.Tensor) -> torch.Tensor:
    return linear(hidden, w.head)


@attrs.frozen
class Fed:
    """A layer's FFN output not yet added to the residual (no hyper-connections): the next layer adds
    it as it norms its input, or the stack as it norms its output, in one launch (``add_zrms``)."""

    values: torch.Tensor


@attrs.frozen
class Normed:
    """The residual's norm for what comes after a layer (the next layer's input, or the stack's
    output), made in the layer's own last launch: an MoE block's (``moe_add_zrms``)."""

    values: torch.Tensor


Carried = hyper.Pending | Fed | Normed  # what one layer hands the next (``run_layer``)


def run_layer(w: StackWeights, layer: LayerWeights, x: torch.Tensor, spans: Sequence[Span],
              rows: PageRows, lanes: PromptLanes | LanesOnce | None = None, pending: Carried | None = None,
              then: torch.Tensor | None = None) -> tuple[torch.Tensor, Carried | None]:
    """One decoder layer over the residual ``x`` of every span's rows, in span order; with
    ``lanes`` (prompt spans on CUDA) a GDN or dense attention layer runs every span in one pass.

    With hyper-connections a block's output is written into the streams with the next read
    (``hyper.read_after``): ``pending`` is the layer before's FFN output, and this layer's is
    returned for the next read. Without them, ``x`` the residual with the FFN's and None; or, given
    ``then`` (the weight of the norm after the layer), the FFN's output added in the launch that makes
    that norm, which the next call takes as ``pending``: the residual without it and the output
    (``Fed``), or an MoE block's residual with it and the norm (``Normed``, in the block's last launch).
    The same bits: ``add_zrms`` is the addition then the norm, ``moe_add_zrms`` is ``add_zrms``."""
    bounds = _bounds(spans)
    if isinstance(pending, Normed | Fed) and (layer.ple is not None or layer.attn_hyper is not None):
        raise ValueError(f"layer {layer.name} reads streams: the layer before must hand on its FFN's output")
    if layer.ple is not None and pending is not None:  # PLE reads the streams written
        assert isinstance(pending, tuple)
        x, pending = hyper.write(x, *pending), None
    if layer.ple is not None:
        x = x + torch.cat([
            ple(layer.ple, x[a:b], span.tokens, span.lane.pieces["ple.tail"],
                span.lane.pieces["ple.history"])
            for span, (a, b) in zip(spans, bounds, strict=True)])
    if layer.attn_hyper is not None:
        assert not isinstance(pending, Fed | Normed)
        x, block_input, weights = hyper.read_after(layer.attn_hyper, x, pending)
    elif isinstance(pending, Normed):
        block_input, weights = pending.values, None
    elif isinstance(pending, Fed):
        assert layer.input_norm is not None
        (x, block_input), weights = add_zrms(x, pending.values, layer.input_norm, w.eps), None
    else:
        assert layer.input_norm is not None
        block_input, weights = zrms(x, layer.input_norm, w.eps), None
    if lanes is not None and isinstance(layer.mixer, GdnWeights):
        mixed = gdn_spans(layer.mixer, block_input, lanes, layer.name)
    elif lanes is not None and isinstance(layer.mixer, AttentionWeights) and layer.mixer.indexer is None:
        mixed = attention_spans(layer.mixer, block_input, lanes, rows.views[f"{layer.name}.k"],
                                rows.views[f"{layer.name}.v"], w.rotary)
    else:
        mixed = torch.cat([_mix(w, layer, block_input[a:b], span, rows)
                           for span, (a, b) in zip(spans, bounds, strict=True)])
    mixed = w.reduce(mixed)
    if layer.mlp_hyper is not None:  # the write and the next read's norm at once (a layer has both or none)
        assert weights is not None
        x, block_input, weights = hyper.read_after(layer.mlp_hyper, x, (mixed, weights))
    else:
        assert layer.post_norm is not None
        (x, block_input), weights = add_zrms(x, mixed, layer.post_norm, w.eps), None  # one launch on CUDA
    if then is not None and weights is None and isinstance(layer.ffn, MoeWeights) and w.parallel is None:
        x, normed = moe_add_zrms(layer.ffn, block_input, x, then, w.eps)  # the combine adds and norms
        return x, Normed(normed)
    fed = w.reduce(moe(layer.ffn, block_input) if isinstance(layer.ffn, MoeWeights)
                   else dense(layer.ffn, block_input))
    if weights is not None:
        return x, (fed, weights)
    return (x, Fed(fed)) if then is not None else (x + fed, None)


def _mix(w: StackWeights, layer: LayerWeights, x: torch.Tensor, span: Span, rows: PageRows) -> torch.Tensor:
    if isinstance(layer.mixer, GdnWeights):
        pieces = span.lane.pieces
        return gdn(layer.mixer, x, pieces[f"{layer.name}.state"], pieces[f"{layer.name}.conv_tail"],
                   span.start, span.decode)
    return attention(layer.mixer, x, span, rows, layer.name, w.rotary)


def _bounds(spans: Sequence[Span]) -> list[tuple[int, int]]:
    bounds, at = [], 0
    for span in spans:
        bounds.append((at, at + span.length))
        at += span.length
    return bounds


def first_product(block: GdnWeights | AttentionWeights | DenseMlp | MoeWeights) -> Weight | Experts | None:
    """The weight of the first product a decode row's block runs on its input, where its input reaches
    it as one product's rows (GDN, dense attention, a dense MLP's gate|up, an MoE block's experts'
    gate|up); else None."""
    if isinstance(block, GdnWeights):
        return block.proj
    if isinstance(block, AttentionWeights):
        return block.qkv if block.indexer is None else None
    if isinstance(block, DenseMlp):
        return None if block.paired else block.gate_up
    return block.gate_up

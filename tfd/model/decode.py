"""Decode rows of many lanes in one batched pass: the step that CUDA graphs capture.

A decode step gives each running lane one row. Here all of them go through every layer together:
the products over all rows, the GDN rule and conv through each lane's state and tail in the pool
(element offsets, no gather), attention through page tables. Everything a step varies sits in one
int64 tensor (``tfd.model.decode_batch.DecodeBatch``) so a captured graph reads it from a fixed address;
a padding lane (offsets -1, length 0) computes garbage that touches no memory of any lane.

Both residual forms take this path: Qwen3.5 and Qwen3-Next's plain blocks between RMSNorms, and
Flash Next's streams (hyper-connection reads and writes, PLE at its lanes' tail and n-gram history
offsets, QSA layers choosing each lane's blocks among all its page table can hold, the final mixer).
A Flash Next row gets the bits ``stack.run_stack`` gives it as a one-row decode span, on the CPU
exactly (the tests hold every pool byte to it); on CUDA its GDN layers run the decode kernels where
the span path runs their torch references, as dense attention rows run ``paged_attention.decode``
for Qwen. (A checkpoint's n-gram table stored in shards is joined into one table at load.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import torch

from tfd.model import hyper
from tfd.model.attention import QsaCaches, attention_rows, sparse_rows
from tfd.model.decode_batch import DecodeBatch, lane_fields
from tfd.model.gdn import GdnWeights, gdn_rows
from tfd.model.memory import element_offset, piece_offsets
from tfd.model.mlp import MoeWeights, dense, moe, moe_add_zrms
from tfd.model.mtp import Draft, MtpWeights
from tfd.model.ops import Input, add_zrms, add_zrms_into, linear, values_of, zrms, zrms_into
from tfd.model.ple import ple_rows, ple_window
from tfd.model.qsa import DecodeRows, decode_rows
from tfd.model.rope import Rotary
from tfd.model.stack import LayerWeights, StackOutput, StackWeights, first_product
from tfd.model.verify import VerifyLanes, gdn_window
from tfd.pool.pages import Pool
from tfd_kernels import step_inputs


class DecodeMemory:
    """The pool as the decode kernels address it: typed views of the whole buffer (fp32 states, the
    model dtype's tails, int64 n-gram histories) and each attention layer's row parts; and ``feed``,
    the tokens decode steps drew, at the rows their columns name, which a later step's token fields
    name in turn: two halves of ``lanes`` rows, so a step draws into one while the last step's draws
    in the other are still being copied to the host (``half``)."""

    def __init__(self, pool: Pool, dtype: torch.dtype, lanes: int = 1) -> None:
        self.pool = pool
        self.states = pool.buffer.view(torch.float32)
        self.tails = pool.buffer.view(dtype)
        self.histories = pool.buffer.view(torch.int64)
        self.caches = {part.name: pool.rows(part.name) for part in pool.layout.row_parts}
        self.lanes = max(1, lanes)
        self.feed = torch.zeros(2 * self.lanes, dtype=torch.int64, device=pool.buffer.device)
        self._angles: dict[tuple[int, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def angle_tables(self, rotary: Rotary, pages: int, dtype: torch.dtype
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [positions, rotary.dim] of every position a lane of ``pages`` row pages can hold,
        made once (on the pool's device, by ``rotary.angles``) for ``tfd_kernels.step_inputs`` to gather."""
        rows = pages * self.pool.layout.page_rows
        found = self._angles.get((rows, dtype))
        if found is None:
            positions = torch.arange(rows, dtype=torch.int64, device=self.pool.buffer.device)
            found = self._angles[(rows, dtype)] = rotary.angles(positions, dtype)
        return found

    def half(self, parity: int) -> range:
        """The feed rows of half ``parity`` (0 or 1), a row a lane in column order."""
        return range(parity * self.lanes, (parity + 1) * self.lanes)

    def offset(self, view: torch.Tensor) -> int:
        """A piece view's element offset in the pool view of its dtype."""
        return element_offset(self.pool.buffer, view)

    def lane_offsets(self, pieces: Mapping[str, torch.Tensor], gdn_layers: Sequence[str], ple: bool
                     ) -> list[int]:
        """A lane's offset fields in ``Columns`` order, from its piece views: each GDN layer's state,
        each one's conv tail, then (``ple``) the PLE tail and n-gram history."""
        names = [f"{name}.state" for name in gdn_layers] + [f"{name}.conv_tail" for name in gdn_layers]
        return piece_offsets(self.pool.buffer, pieces, names + (["ple.tail", "ple.history"] if ple else []))


@attrs.frozen
class _Step:
    """What every layer of one step reads: the batch, the pool, the rows' angles, and the page table
    and visible keys as int32 (the kernels' form)."""

    batch: DecodeBatch
    memory: DecodeMemory
    cos: torch.Tensor
    sin: torch.Tensor
    table: torch.Tensor
    lengths: torch.Tensor
    verify: VerifyLanes | None = None  # the rows are verify windows (tfd.model.verify)
    offsets: torch.Tensor | None = None  # with verify: each lane's offset fields (``lane_fields``)
    tables: tuple[torch.Tensor, torch.Tensor] | None = None  # on CUDA: every position's angles
    qsa_rows: DecodeRows | None = None  # with QSA layers: the rows as each reads them, made once


def run_decode(w: StackWeights, batch: DecodeBatch, memory: DecodeMemory, verify: VerifyLanes | None = None
               ) -> torch.Tensor:
    """The head's input rows [lanes, width] (after the final norm or mixer) of one decode row per
    lane; states, tails, PLE pieces and row parts move past the row. A fed token field (negative)
    is resolved from ``memory.feed`` and written back. Raises ValueError when the stack has a PLE
    layer and the batch's columns no PLE offsets.

    With ``verify``, the batch's columns are ``verify.rows`` rows a lane, together: each lane's
    GDN states and conv tails, PLE tail and n-gram history stay as they are (``tfd.model.verify``,
    ``ple.ple_window``)."""
    return run_rows(w, batch, memory, verify).hidden


def run_rows(w: StackWeights, batch: DecodeBatch, memory: DecodeMemory, verify: VerifyLanes | None = None
             ) -> StackOutput:
    """``run_decode``'s rows, and the residual before the final norm or mixer (what Flash Next's MTP
    head reads)."""
    x, step = _begin(w, batch, memory)
    if verify is not None:
        step = attrs.evolve(step, verify=verify, offsets=verify.firsts(lane_fields(batch)))
    hidden, residual = _streams(w, x, step) if w.mixer is not None else _plain(w, x, step)
    return StackOutput(hidden, residual)


def run_draft_rows(w: StackWeights, head: MtpWeights, batch: DecodeBatch, memory: DecodeMemory,
                   previous: torch.Tensor) -> Draft:
    """MTP cells (``tfd.model.mtp``) as decode rows: a cell a column of ``batch`` (token x_(t+1) at
    position t, the head's K/V row written at t through the lane's page table) from ``previous``
    [columns, width], the main model's rows (``HybridModel.draft_input``) or the last cells' carry."""
    layer = head.layer
    embedded, step = _begin(w, batch, memory)
    if head.mixer is not None:  # Flash Next: the streams, each from the main model's, then the head's mixer
        assert head.fc_embed is not None and head.fc_hidden is not None
        width = embedded.shape[-1]
        normed = zrms(previous, head.hidden_norm, w.eps)
        streams = linear(normed.reshape(-1, width), head.fc_hidden).view(normed.shape[0], -1, width)
        x = (streams + linear(zrms(embedded, head.embed_norm, w.eps), head.fc_embed)[:, None, :]).flatten(-2)
        x, pending = _stream_layer(w, layer, x, 0, step, None)
        x, hidden, _ = hyper.read_after(head.mixer, x, pending)
        return Draft(hidden, x)
    assert head.fc is not None and head.final_norm is not None
    assert layer.input_norm is not None and layer.post_norm is not None
    x = linear(torch.cat((zrms(embedded, head.embed_norm, w.eps), zrms(previous, head.hidden_norm, w.eps)),
                         dim=-1), head.fc)
    x, h = add_zrms(x, _mix(w, layer, zrms(x, layer.input_norm, w.eps), 0, step), layer.post_norm, w.eps)
    if isinstance(layer.ffn, MoeWeights) and w.parallel is None:
        _, hidden = moe_add_zrms(layer.ffn, h, x, head.final_norm, w.eps)
    else:
        _, hidden = add_zrms(x, _ffn(w, layer, h), head.final_norm, w.eps)
    return Draft(hidden, hidden)


def _begin(w: StackWeights, batch: DecodeBatch, memory: DecodeMemory) -> tuple[torch.Tensor, _Step]:
    """The rows' embeddings (fed tokens resolved from ``memory.feed`` and written back) and what
    every layer reads."""
    if batch.packed.is_cuda:  # one launch for what torch takes ten
        tables = memory.angle_tables(w.rotary, batch.columns.pages, w.embed.dtype)
        inputs = step_inputs.gather(batch.packed, batch.columns.table_field, w.embed, *tables, memory.feed)
        return inputs.x, _Step(batch, memory, inputs.cos, inputs.sin, inputs.table, inputs.lengths,
                               tables=tables, qsa_rows=_qsa_rows(w, inputs.lengths))
    batch.tokens.copy_(step_inputs.fed_tokens(batch.tokens, memory.feed))
    x = w.embed[batch.tokens]
    cos, sin = w.rotary.angles(batch.positions, x.dtype)
    table = batch.page_table.to(torch.int32, memory_format=torch.contiguous_format)
    lengths = batch.lengths.to(torch.int32)
    return x, _Step(batch, memory, cos, sin, table, lengths, qsa_rows=_qsa_rows(w, lengths))


def _qsa_rows(w: StackWeights, lengths: torch.Tensor) -> DecodeRows | None:
    """The step's rows as its QSA layers read them (the MTP head's too: Flash Next's stack has them)."""
    if any(getattr(layer.mixer, "indexer", None) is not None for layer in w.layers):
        return decode_rows(lengths)
    return None


def _plain(w: StackWeights, x: torch.Tensor, step: _Step) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks added to one residual between RMSNorms, each add joined with the next norm (an MoE
    block's in its own last launch)."""
    first = w.layers[0].input_norm
    assert first is not None
    following = [layer.input_norm for layer in w.layers[1:]] + [w.final_norm]
    # each norm's rows made with their FP8 form where the product reading them is FP8 (not the final
    # norm's: the hidden rows go on to the logits, the drafts and the kept states)
    reading = [first_product(layer.mixer) for layer in w.layers[1:]] + [None]
    gdn_layer = 0
    h: Input = zrms_into(x, first, w.eps, first_product(w.layers[0].mixer))
    for layer, norm, into in zip(w.layers, following, reading, strict=True):
        assert layer.post_norm is not None and norm is not None
        mixed = _mix(w, layer, h, gdn_layer, step)
        if isinstance(layer.mixer, GdnWeights):
            gdn_layer += 1
        if isinstance(layer.ffn, MoeWeights) and w.parallel is None:
            x, normed = add_zrms_into(x, mixed, layer.post_norm, w.eps, first_product(layer.ffn))
            x, h = moe_add_zrms(layer.ffn, normed, x, norm, w.eps)
        else:  # under tensor parallel the MoE's grouped launches read its rows unquantized (no FP8 rows)
            ffn = None if isinstance(layer.ffn, MoeWeights) else first_product(layer.ffn)
            x, h = add_zrms_into(x, mixed, layer.post_norm, w.eps, ffn)
            x, h = add_zrms_into(x, _ffn(w, layer, h), norm, w.eps, into)
    return values_of(h), x


def _streams(w: StackWeights, x: torch.Tensor, step: _Step) -> tuple[torch.Tensor, torch.Tensor]:
    """Flash Next's residual streams: PLE where a layer has it, each block read from the streams and
    written back by its hyper-connection, then the final mixer (``stack.run_layer``'s order)."""
    assert w.mixer is not None
    batch, memory = step.batch, step.memory
    x = x.repeat(1, w.streams)
    gdn_layer, pending = 0, None
    for layer in w.layers:
        if layer.ple is not None and pending is not None:  # PLE reads the streams written
            x, pending = hyper.write(x, *pending), None
        if layer.ple is not None and step.verify is not None:
            assert step.offsets is not None
            ple_at = 2 * batch.columns.gdn_layers  # a lane's PLE tail and history offsets
            x = x + ple_window(layer.ple, x, batch.tokens, step.verify.rows, memory.tails,
                               step.offsets[ple_at], memory.histories, step.offsets[ple_at + 1],
                               step.verify.ple_rows_at)
        elif layer.ple is not None:
            x = x + ple_rows(layer.ple, x, batch.tokens, memory.tails, batch.ple_tail_at, memory.histories,
                             batch.ple_history_at)
        x, pending = _stream_layer(w, layer, x, gdn_layer, step, pending)
        if isinstance(layer.mixer, GdnWeights):
            gdn_layer += 1
    x, hidden, _ = hyper.read_after(w.mixer, x, pending)
    return hidden, x


def _stream_layer(w: StackWeights, layer: LayerWeights, x: torch.Tensor, gdn_layer: int, step: _Step,
                  pending: hyper.Pending | None) -> tuple[torch.Tensor, hyper.Pending]:
    """One layer over the streams ``x`` once ``pending`` (the layer before's FFN output) is written:
    its mixer and its FFN, each read and written back by its hyper-connection; the FFN's output is
    returned to be written with the next read (``stack.run_layer``'s order and launches)."""
    assert layer.attn_hyper is not None and layer.mlp_hyper is not None
    x, h, weights = hyper.read_after(layer.attn_hyper, x, pending)
    assert weights is not None
    x, h, weights = hyper.read_after(layer.mlp_hyper, x, (_mix(w, layer, h, gdn_layer, step), weights))
    assert weights is not None
    return x, (_ffn(w, layer, h), weights)


def _ffn(w: StackWeights, layer: LayerWeights, h: Input) -> torch.Tensor:
    """The layer's FFN over every row, summed over the ranks (on one, an MoE's add is fused in ``_plain``)."""
    ffn = layer.ffn
    return w.reduce(moe(ffn, values_of(h)) if isinstance(ffn, MoeWeights) else dense(ffn, h))


def _mix(w: StackWeights, layer: LayerWeights, h: Input, gdn_layer: int, step: _Step) -> torch.Tensor:
    """The layer's token mixer over every lane's row (GDN, dense attention or QSA), summed over the ranks."""
    return w.reduce(_mixer(w, layer, h, gdn_layer, step))


def _mixer(w: StackWeights, layer: LayerWeights, h: Input, gdn_layer: int, step: _Step
           ) -> torch.Tensor:
    batch, memory = step.batch, step.memory
    if isinstance(layer.mixer, GdnWeights):
        if step.verify is not None:  # a lane's rows share its offsets: its first row's
            assert step.offsets is not None
            state_at, tail_at = step.offsets[gdn_layer], step.offsets[batch.columns.gdn_layers + gdn_layer]
            return gdn_window(layer.mixer, h, step.verify, gdn_layer, memory.states, state_at, memory.tails,
                              tail_at)
        return gdn_rows(layer.mixer, h, memory.states, batch.state_at(gdn_layer), memory.tails,
                        batch.tail_at(gdn_layer))
    caches = memory.caches
    keys, values = caches[f"{layer.name}.k"], caches[f"{layer.name}.v"]
    if layer.mixer.indexer is None:
        return attention_rows(layer.mixer, h, step.cos, step.sin, w.rotary, keys, values, step.table,
                              step.lengths)
    qsa = QsaCaches(keys, values, caches[f"{layer.name}.index"], caches[f"{layer.name}.pooled"])
    assert step.qsa_rows is not None
    return sparse_rows(layer.mixer, values_of(h), step.cos, step.sin, w.rotary, qsa, step.table, step.lengths,
                       step.qsa_rows, step.tables)


def batches(w: StackWeights) -> bool:
    """Whether this stack takes the batched decode path: plain residual blocks, or Flash Next's
    streams with hyper-connections on every layer and a final mixer; GDN, dense or QSA mixers, PLE."""
    if w.mixer is None:
        return w.streams == 1 and w.final_norm is not None and all(
            layer.input_norm is not None and layer.post_norm is not None and layer.ple is None
            and layer.attn_hyper is None for layer in w.layers)
    return all(layer.attn_hyper is not None and layer.mlp_hyper is not None for layer in w.layers)


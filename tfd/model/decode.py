"""Decode rows of many lanes in one batched pass: the step that CUDA graphs capture.

A decode step gives each running lane one row. Here all of them go through every layer together:
the products over all rows, the GDN rule and conv through each lane's state and tail in the pool
(element offsets, no gather), attention through page tables. Everything a step varies sits in one
int64 tensor (``DecodeBatch.packed``, one row per field so each field is contiguous across lanes)
so a captured graph reads it from a fixed address; a padding lane (offsets -1, length 0) computes
garbage that touches no memory of any lane.

Only families whose layers are all plain residual blocks with GDN or dense attention take this
path (Qwen3.5, Qwen3-Next); Flash Next's streams, PLE and QSA run through ``stack.run_stack``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import attrs
import torch

from tfd.model.attention import AttentionWeights, attention_rows
from tfd.model.gdn import GdnWeights, gdn_rows
from tfd.model.memory import element_offset, to_device
from tfd.model.mlp import MoeWeights, dense, moe
from tfd.model.ops import add_zrms, zrms
from tfd.model.stack import StackWeights
from tfd.pool.pages import Pool

FIXED = 5  # fields before the offsets: token, position, visible keys, seed, temperature


@attrs.frozen
class Columns:
    """Which rows of ``DecodeBatch.packed`` hold each field (a lane's fields are one column)."""

    gdn_layers: int
    pages: int  # page-table width: the most row pages a lane may hold

    @property
    def width(self) -> int:
        return FIXED + 2 * self.gdn_layers + self.pages

    def column(self, token: int, position: int, seed: int, temperature: float, state_at: Sequence[int],
               tail_at: Sequence[int], pages: Sequence[int], null_page: int) -> list[int]:
        """A live lane's fields: token, position, visible keys, its sampling key and temperature
        (fp32 bits), offsets, page table padded with the null page."""
        bits = struct.unpack("<i", struct.pack("<f", temperature))[0]
        return [token, position, position + 1, seed, bits, *state_at, *tail_at, *pages,
                *[null_page] * (self.pages - len(pages))]

    def padding(self, null_page: int) -> list[int]:
        """A padding lane's fields: no keys, greedy, offsets -1, every page the null page."""
        return [0, 0, 0, 0, 0, *[-1] * (2 * self.gdn_layers), *[null_page] * self.pages]


@attrs.frozen
class DecodeBatch:
    """``packed`` [columns.width, lanes] int64 on the device; the fields are views of it, each
    contiguous across lanes (``page_table`` is [lanes, pages] with a lane stride of one)."""

    packed: torch.Tensor
    columns: Columns

    @classmethod
    def of(cls, columns: list[list[int]], layout: Columns, device: torch.device) -> DecodeBatch:
        """From each lane's ``Columns.column`` (an asynchronous copy from pinned memory on CUDA)."""
        return cls(to_device(torch.tensor(columns, dtype=torch.int64).T.contiguous(), device), layout)

    @property
    def tokens(self) -> torch.Tensor:
        return self.packed[0]

    @property
    def positions(self) -> torch.Tensor:
        return self.packed[1]

    @property
    def lengths(self) -> torch.Tensor:
        return self.packed[2]

    @property
    def seeds(self) -> torch.Tensor:
        return self.packed[3]

    @property
    def temperature(self) -> torch.Tensor:
        """fp32 [lanes], from the bits each column holds."""
        return self.packed[4].to(torch.int32).view(torch.float32)

    def state_at(self, layer: int) -> torch.Tensor:
        return self.packed[FIXED + layer]

    def tail_at(self, layer: int) -> torch.Tensor:
        return self.packed[FIXED + self.columns.gdn_layers + layer]

    @property
    def page_table(self) -> torch.Tensor:
        return self.packed[FIXED + 2 * self.columns.gdn_layers:].T


class DecodeMemory:
    """The pool as the decode kernels address it: typed views of the whole buffer and each
    attention layer's K/V caches."""

    def __init__(self, pool: Pool, dtype: torch.dtype) -> None:
        self.pool = pool
        self.states = pool.buffer.view(torch.float32)
        self.tails = pool.buffer.view(dtype)
        self.caches = {part.name: pool.rows(part.name) for part in pool.layout.row_parts}

    def offset(self, view: torch.Tensor) -> int:
        """A piece view's element offset in the pool view of its dtype."""
        return element_offset(self.pool.buffer, view)


def run_decode(w: StackWeights, batch: DecodeBatch, memory: DecodeMemory) -> torch.Tensor:
    """The final-norm hidden rows [lanes, width] of one decode row per lane; states, tails and
    caches move past the row."""
    x = w.embed[batch.tokens]
    cos, sin = w.rotary.angles(batch.positions, x.dtype)
    table = batch.page_table.to(torch.int32, memory_format=torch.contiguous_format)
    lengths = batch.lengths.to(torch.int32)
    gdn_layer = 0
    delta: torch.Tensor | None = None  # the last block's output, added with the next norm
    for layer in w.layers:
        assert layer.input_norm is not None and layer.post_norm is not None
        if delta is None:
            h = zrms(x, layer.input_norm, w.eps)
        else:
            x, h = add_zrms(x, delta, layer.input_norm, w.eps)
        if isinstance(layer.mixer, GdnWeights):
            mixed = gdn_rows(layer.mixer, h, memory.states, batch.state_at(gdn_layer), memory.tails,
                             batch.tail_at(gdn_layer))
            gdn_layer += 1
        else:
            assert isinstance(layer.mixer, AttentionWeights) and layer.mixer.indexer is None
            mixed = attention_rows(layer.mixer, h, cos, sin, w.rotary, memory.caches[f"{layer.name}.k"],
                                   memory.caches[f"{layer.name}.v"], table, lengths)
        x, h = add_zrms(x, mixed, layer.post_norm, w.eps)
        delta = moe(layer.ffn, h) if isinstance(layer.ffn, MoeWeights) else dense(layer.ffn, h)
    assert w.final_norm is not None and delta is not None
    return add_zrms(x, delta, w.final_norm, w.eps)[1]


def batches(w: StackWeights) -> bool:
    """Whether this stack takes the batched decode path (plain residual blocks, dense attention)."""
    return w.streams == 1 and w.mixer is None and all(
        layer.ple is None and layer.attn_hyper is None and
        (isinstance(layer.mixer, GdnWeights) or layer.mixer.indexer is None) for layer in w.layers)

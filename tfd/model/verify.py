"""Verify windows: each lane's pending token and its drafts in one batched pass, its state untouched.

A window is ``rows`` rows of one lane at consecutive positions, laid out as decode rows (a lane's
rows next to each other in ``DecodeBatch``, each with its own position and visible keys). Every
layer but GDN runs them as decode rows: products and MoE row by row, attention writing every row's
K and V before any row attends its keys up to its own position, so row i sees rows before it. A GDN
layer runs a lane's rows in order from its committed state and conv tail and changes neither: the
state after the last row goes to the lane's spare (``tfd_kernels.gdn_decode.verify``), each row's k, v,
g and beta to its replay log, each row's conv input to its ``conv_rows`` piece
(``tfd_kernels.conv1d.verify``). Each row gets the bits serial decoding gives it at its position.

``commit`` then makes a lane's state what serial decoding of its first ``keep`` rows leaves: the
logged rows replayed into the committed state (the routine decode updates it with), the conv tail
rebuilt as the last rows of [old tail; kept rows' inputs] (``tfd_kernels.conv1d.rebuild``). Attention
rows past the kept ones are left for later rows to overwrite. Everything stays on the device: ``keep``
is a device tensor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import torch

from tfd.model.gdn import GdnWeights, finish, project, split_heads, split_projection
from tfd.model.memory import element_offset, to_device
from tfd.model.ops import Input, linear, values_of
from tfd_kernels import conv1d, gdn_decode, gdn_reference

FIELDS = 3  # offsets a lane has per GDN layer: spare state, replay log, conv rows


@attrs.frozen
class VerifyLanes:
    """Per lane of a verify batch: ``rows`` rows each, and for each GDN layer the element offsets of
    its spare state (fp32), replay log (fp32) and conv rows (model dtype) as ``packed`` [FIELDS x
    layers, lanes] int64 on the device (-1 for a padding lane)."""

    rows: int
    packed: torch.Tensor
    ple: bool = False  # a last row: each lane's kept PLE inputs (model dtype)

    @classmethod
    def of(cls, rows: int, offsets: Sequence[Sequence[int]], device: torch.device, ple: bool = False
           ) -> VerifyLanes:
        """From each lane's ``lane_offsets`` (a list per lane; ``padding`` for a padding lane)."""
        if rows < 1:
            raise ValueError(f"a verify window has at least one row, got {rows}")
        return cls(rows, to_device(torch.tensor(offsets, dtype=torch.int64).T.contiguous(), device), ple)

    @staticmethod
    def lane_offsets(pieces: Mapping[str, torch.Tensor], gdn_layers: Sequence[str], buffer: torch.Tensor
                     ) -> list[int]:
        """A lane's fields from its piece views: each GDN layer's spare, then logs, then conv rows;
        with PLE its kept inputs last."""
        found = [element_offset(buffer, pieces[f"{name}.{part}"])
                 for part in ("spare", "log", "conv_rows") for name in gdn_layers]
        return found + ([element_offset(buffer, pieces["ple.rows"])] if "ple.rows" in pieces else [])

    @staticmethod
    def padding(gdn_layers: int, ple: bool = False) -> list[int]:
        return [-1] * (FIELDS * gdn_layers + (1 if ple else 0))

    @property
    def ple_rows_at(self) -> torch.Tensor:
        """Each lane's kept PLE inputs' offset; ValueError without PLE."""
        if not self.ple:
            raise ValueError("these verify lanes have no PLE offsets")
        return self.packed[-1]

    @property
    def lanes(self) -> int:
        return int(self.packed.shape[1])

    def spare_at(self, layer: int) -> torch.Tensor:
        return self.packed[layer]

    def log_at(self, layer: int) -> torch.Tensor:
        return self.packed[self.layers + layer]

    def rows_at(self, layer: int) -> torch.Tensor:
        return self.packed[2 * self.layers + layer]

    def firsts(self, fields: torch.Tensor) -> torch.Tensor:
        """Per-row fields [n, lanes * rows] at each lane's first row, as [n, lanes] in one copy (each
        row contiguous, as the kernels take them): a lane's rows share their offsets."""
        return fields[:, ::self.rows].contiguous()

    @property
    def layers(self) -> int:
        return int(self.packed.shape[0]) // FIELDS


def gdn_window(w: GdnWeights, x: Input, lanes: VerifyLanes, layer: int, states: torch.Tensor,
               state_at: torch.Tensor, tails: torch.Tensor, tail_at: torch.Tensor) -> torch.Tensor:
    """A GDN layer over verify windows: ``x`` [lanes * rows, hidden], a lane's rows together (with their
    FP8 form, ``Fp8Rows``, for an FP8 projection); ``state_at``/``tail_at`` [lanes] its committed state
    and conv tail, which stay as they are."""
    rows = lanes.rows
    values = values_of(x)
    count = values.shape[0] // rows

    def windows(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(count, rows, *t.shape[1:])

    memory = (states, state_at, lanes.spare_at(layer), states, lanes.log_at(layer), w.key_dim ** -0.5)
    if values.is_cuda:  # decode's product bits (decode applies the conv in its epilogue; here after), the
        # gates formed in the rule's kernel as decode forms them
        mixed, z, b, a = split_projection(w, linear(x, w.proj))
        q, k, v = split_heads(w, conv1d.verify(mixed, w.conv, tails, tail_at, lanes.rows_at(layer)))
        out = gdn_decode.verify_gated(windows(q), windows(k), windows(v), windows(b), windows(a), w.a_log,
                                      w.dt_bias, *memory)
    else:
        p = project(w, values)
        z = p.z
        mixed = conv1d.reference_verify(p.mixed, w.conv, tails, tail_at, lanes.rows_at(layer))
        q, k, v = split_heads(w, mixed)
        out = gdn_reference.reference_verify(windows(q), windows(k), windows(v), windows(p.g),
                                             windows(p.beta), *memory)
    # fp32, as gdn_rows passes it
    return finish(w, out.reshape(values.shape[0], w.value_heads, w.value_dim), z)


def commit(weights: Sequence[GdnWeights], lanes: VerifyLanes, keep: torch.Tensor, states: torch.Tensor,
           state_at: torch.Tensor, tails: torch.Tensor, tail_at: torch.Tensor) -> None:
    """Each lane's state as serial decoding of its first ``keep`` rows (int32 [lanes], 1 to rows)
    leaves it: per GDN layer (``weights``; ``state_at``/``tail_at`` [layers, lanes] the lanes'
    offsets, contiguous) the logged rows replayed into the committed state, the conv tail rebuilt
    from the old one and the kept rows' inputs. Layers of one shape go in one launch each (the
    replay, the rebuild). A padding lane is not touched."""
    count = len(weights)
    logs, kept_rows = lanes.packed[count:2 * count], lanes.packed[2 * count:3 * count]
    replay = gdn_decode.replay if states.is_cuda else gdn_reference.reference_replay
    rebuild = conv1d.rebuild if tails.is_cuda else conv1d.reference_rebuild
    for first, last in _same_shapes(weights):
        w = weights[first]
        shape = {"key_heads": w.key_heads, "value_heads": w.value_heads, "key_dim": w.key_dim,
                 "value_dim": w.value_dim}
        at = state_at[first:last]
        replay(states, logs[first:last], states, at, at, keep, **shape)
        rebuild(tails, tail_at[first:last], kept_rows[first:last], keep, w.conv.shape[1], w.conv.shape[0])


def _same_shapes(weights: Sequence[GdnWeights]) -> list[tuple[int, int]]:
    """Runs of consecutive layers whose state and conv have one shape, as (first, end) indices."""
    def shape(w: GdnWeights) -> tuple[int, ...]:
        return (w.key_heads, w.value_heads, w.key_dim, w.value_dim, *w.conv.shape)

    runs: list[tuple[int, int]] = []
    for index, w in enumerate(weights):
        if runs and shape(weights[runs[-1][0]]) == shape(w):
            runs[-1] = (runs[-1][0], index + 1)
        else:
            runs.append((index, index + 1))
    return runs

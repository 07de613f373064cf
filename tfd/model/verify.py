"""Verify windows: each lane's pending token and its drafts in one batched pass, its state untouched.

A window is ``rows`` rows of one lane at consecutive positions, laid out as decode rows (a lane's
rows next to each other in ``DecodeBatch``, each with its own position and visible keys). Every
layer but GDN runs them as decode rows: products and MoE row by row, attention writing every row's
K and V before any row attends its keys up to its own position, so row i sees rows before it. A GDN
layer runs a lane's rows in order from its committed state and conv tail and changes neither: the
state after the last row goes to the lane's spare (``kernels.gdn_decode.verify``), each row's k, v,
g and beta to its replay log, each row's conv input to its ``conv_rows`` piece. Each row gets the
bits serial decoding gives it at its position (the conv a row at a time, as decode runs it).

``commit`` then makes a lane's state what serial decoding of its first ``keep`` rows leaves: the
logged rows replayed into the committed state (the routine decode updates it with), the conv tail
rebuilt as the last rows of [old tail; kept rows' inputs]. Attention rows past the kept ones are
left for later rows to overwrite. Everything stays on the device: ``keep`` is a device tensor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import torch

from kernels import conv1d, gdn_decode, lane_rows
from tfd.model.gdn import GdnWeights, finish, project, split_heads
from tfd.model.memory import element_offset, to_device

FIELDS = 3  # offsets a lane has per GDN layer: spare state, replay log, conv rows


@attrs.frozen
class VerifyLanes:
    """Per lane of a verify batch: ``rows`` rows each, and for each GDN layer the element offsets of
    its spare state (fp32), replay log (fp32) and conv rows (model dtype) as ``packed`` [FIELDS x
    layers, lanes] int64 on the device (-1 for a padding lane)."""

    rows: int
    packed: torch.Tensor

    @classmethod
    def of(cls, rows: int, offsets: Sequence[Sequence[int]], device: torch.device) -> VerifyLanes:
        """From each lane's ``lane_offsets`` (a list per lane; ``padding`` for a padding lane)."""
        if rows < 1:
            raise ValueError(f"a verify window has at least one row, got {rows}")
        return cls(rows, to_device(torch.tensor(offsets, dtype=torch.int64).T.contiguous(), device))

    @staticmethod
    def lane_offsets(pieces: Mapping[str, torch.Tensor], gdn_layers: Sequence[str], buffer: torch.Tensor
                     ) -> list[int]:
        """A lane's fields from its piece views: each GDN layer's spare, then logs, then conv rows."""
        return [element_offset(buffer, pieces[f"{name}.{part}"])
                for part in ("spare", "log", "conv_rows") for name in gdn_layers]

    @staticmethod
    def padding(gdn_layers: int) -> list[int]:
        return [-1] * (FIELDS * gdn_layers)

    @property
    def lanes(self) -> int:
        return int(self.packed.shape[1])

    def spare_at(self, layer: int) -> torch.Tensor:
        return self.packed[layer]

    def log_at(self, layer: int) -> torch.Tensor:
        return self.packed[self.layers + layer]

    def rows_at(self, layer: int) -> torch.Tensor:
        return self.packed[2 * self.layers + layer]

    def firsts(self, field: torch.Tensor) -> torch.Tensor:
        """A per-row field of the batch at each lane's first row (contiguous, as the kernels take it):
        a lane's rows share their offsets."""
        return field[::self.rows].contiguous()

    @property
    def layers(self) -> int:
        return int(self.packed.shape[0]) // FIELDS


def _lane_runs(at: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of ``size`` consecutive elements from each lane's offset ``at`` [lanes] (a padding
    lane's point at element 0, unused), and which lanes are live."""
    live = at >= 0
    return torch.where(live, at, 0)[:, None] + torch.arange(size, device=at.device), live


def _conv_rows(w: GdnWeights, mixed: torch.Tensor, rows: int, tails: torch.Tensor, tail_at: torch.Tensor,
               rows_at: torch.Tensor) -> torch.Tensor:
    """The conv of each lane's ``rows`` rows of ``mixed`` [lanes * rows, channels] from its tail, a
    row at a time as decode runs it, on a copy of the tails (the lane's own stays); each row's input
    kept at ``rows_at``."""
    channels, width = mixed.shape[1], w.conv.shape[1]
    lanes = tail_at.shape[0]
    index, live = _lane_runs(tail_at, (width - 1) * channels)
    scratch = tails[index].flatten()  # the lanes' tails, copied: the rows move the copy
    scratch_at = torch.where(live, torch.arange(lanes, device=mixed.device) * (width - 1) * channels, -1)
    by_lane = mixed.view(lanes, rows, channels)
    out = torch.empty_like(by_lane)
    for row in range(rows):
        step = by_lane[:, row]
        if mixed.is_cuda:
            out[:, row] = conv1d.decode(step, w.conv, scratch, scratch_at)
        else:
            out[:, row] = conv1d.reference(step, w.conv, scratch, scratch_at)
    _store(by_lane.flatten(1).to(tails.dtype), tails, rows_at)
    return out.view(lanes * rows, channels)


def _store(values: torch.Tensor, into: torch.Tensor, at: torch.Tensor) -> None:
    """Row l of ``values`` at element ``at[l]`` of ``into`` for each live lane: no host sync on CUDA
    (a masked torch store would make one, and a captured round cannot)."""
    (lane_rows.store if into.is_cuda else lane_rows.reference)(values.contiguous(), into, at)


def gdn_window(w: GdnWeights, x: torch.Tensor, lanes: VerifyLanes, layer: int, states: torch.Tensor,
               state_at: torch.Tensor, tails: torch.Tensor, tail_at: torch.Tensor) -> torch.Tensor:
    """A GDN layer over verify windows: ``x`` [lanes * rows, hidden], a lane's rows together;
    ``state_at``/``tail_at`` [lanes] its committed state and conv tail, which stay as they are."""
    rows = lanes.rows
    count = x.shape[0] // rows
    p = project(w, x)  # decode's product bits (on CUDA decode applies the conv in its epilogue; here after)
    q, k, v = split_heads(w, _conv_rows(w, p.mixed, rows, tails, tail_at, lanes.rows_at(layer)))

    def windows(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(count, rows, *t.shape[1:])

    verify = gdn_decode.verify if x.is_cuda else gdn_decode.reference_verify
    out = verify(windows(q), windows(k), windows(v), windows(p.g), windows(p.beta), states, state_at,
                 lanes.spare_at(layer), states, lanes.log_at(layer), w.key_dim ** -0.5)
    return finish(w, out.reshape(x.shape[0], w.value_heads, w.value_dim), p.z)  # fp32, as gdn_rows passes it


def commit(weights: Sequence[GdnWeights], lanes: VerifyLanes, keep: torch.Tensor, states: torch.Tensor,
           state_at: Sequence[torch.Tensor], tails: torch.Tensor, tail_at: Sequence[torch.Tensor]) -> None:
    """Each lane's state as serial decoding of its first ``keep`` rows (int32 [lanes], 1 to rows)
    leaves it: per GDN layer (``weights``, ``state_at``/``tail_at`` its lanes' offsets) the logged
    rows replayed into the committed state, the conv tail rebuilt from the old one and the kept
    rows' inputs. A padding lane is not touched."""
    rows = lanes.rows
    for layer, w in enumerate(weights):
        shape = {"key_heads": w.key_heads, "value_heads": w.value_heads, "key_dim": w.key_dim,
                 "value_dim": w.value_dim}
        replay = gdn_decode.replay if states.is_cuda else gdn_decode.reference_replay
        replay(states, lanes.log_at(layer), states, state_at[layer], state_at[layer], keep, **shape)
        channels, width = w.conv.shape[0], w.conv.shape[1]
        old, _ = _lane_runs(tail_at[layer], (width - 1) * channels)
        new, _ = _lane_runs(lanes.rows_at(layer), rows * channels)
        window = torch.cat((tails[old], tails[new]), dim=1).view(-1, width - 1 + rows, channels)
        # the last width - 1 rows of [old tail; kept rows]: rows keep .. keep + width - 2 of the window
        picks = keep.long()[:, None] + torch.arange(width - 1, device=keep.device)
        tail = window.gather(1, picks[:, :, None].expand(-1, -1, channels))
        _store(tail.flatten(1), tails, tail_at[layer])

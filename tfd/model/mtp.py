"""MTP heads: one extra decoder layer that drafts the token after next (reference/model.md 2.8
and 3.9). No transformers reference exists; tests hold it to a direct transcription of the
formulas.

Cell t pairs the main model's state at row t with the next token x_{t+1} and runs at position t
with the head's own cache rows (layer name ``mtp``). Qwen3.5 and Qwen3-Next feed it the hidden
state after the final norm: u = fc([norm_e(embed x_{t+1}); norm_h(h_t)]), then the layer, then
``norm``. Flash Next feeds it the residual streams before the mixer: each stream becomes
fc_hidden(norm_h(R_t)_c) (one norm statistic over all streams), every stream gets
fc_embed(norm_e(embed x_{t+1})) added, then the layer, then the head's own mixer. What a cell
returns for the next draft step is its final hidden (Qwen) or its streams (Flash Next).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from tfd.model import hyper
from tfd.model.fp8 import Weight
from tfd.model.memory import PageRows, Span
from tfd.model.ops import linear, zrms
from tfd.model.stack import Fed, LayerWeights, Normed, StackWeights, run_layer


@attrs.frozen
class MtpWeights:
    embed_norm: torch.Tensor  # [width], zero-centred
    hidden_norm: torch.Tensor  # [width], or [streams * width] for Flash Next
    layer: LayerWeights  # named "mtp"
    fc: Weight | None = None  # [width, 2 * width]: Qwen3.5 / Qwen3-Next
    fc_embed: Weight | None = None  # [width, width]: Flash Next
    fc_hidden: Weight | None = None  # [width, width], applied to each stream
    final_norm: torch.Tensor | None = None  # Qwen3.5 / Qwen3-Next
    mixer: hyper.HyperWeights | None = None  # Flash Next


@attrs.frozen
class Draft:
    """A cell's head input (to the shared lm_head) and what the next chained cell reads."""

    hidden: torch.Tensor
    carry: torch.Tensor


def draft(w: StackWeights, head: MtpWeights, spans: Sequence[Span], previous: torch.Tensor,
          rows: PageRows) -> Draft:
    """Cells for every span: ``span.tokens`` are the next tokens x_{t+1}, ``span.start`` is t, and
    ``previous`` [rows, ...] holds the main model's (or the previous cell's) state per row."""
    tokens = torch.cat([span.tokens for span in spans])
    embedded = zrms(w.embed[tokens], head.embed_norm, w.eps)
    normed = zrms(previous, head.hidden_norm, w.eps)
    if head.fc is not None:
        x = linear(torch.cat((embedded, normed), dim=-1), head.fc)
    else:
        assert head.fc_embed is not None and head.fc_hidden is not None
        width = embedded.shape[-1]
        streams = linear(normed.reshape(-1, width), head.fc_hidden).view(normed.shape[0], -1, width)
        x = (streams + linear(embedded, head.fc_embed)[:, None, :]).flatten(-2)
    x, pending = run_layer(w, head.layer, x, spans, rows)
    assert not isinstance(pending, Fed | Normed)  # no norm after it given: none deferred
    if head.mixer is not None:
        x, hidden, _ = hyper.read_after(head.mixer, x, pending)
        return Draft(hidden, x)
    assert head.final_norm is not None
    hidden = zrms(x, head.final_norm, w.eps)
    return Draft(hidden, hidden)

"""The reference loop the engine is held to: a model's forward over spans, one lane at a time.

``LanePool`` is a pool sized for a few lanes of one model, each opened with its whole window;
``greedy`` prefills a prompt in chunks that end at multiples of the GDN chunk and then decodes one
token at a time through ``forward`` (no scheduler, no runner, no batched decode step, no graphs).
The engine's tokens (``tfd.engine.stepper``, what ``tfd serve`` and ``tfd generate`` run) must be
these; parity tests hold this loop to transformers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import attrs
import torch

from tfd.families.hybrid import HybridModel
from tfd.model.gdn import CHUNK
from tfd.model.memory import LaneMemory, PageRows, Span
from tfd.model.stack import StackOutput
from tfd.pool.pages import Lease, Pool

PREFILL_CHUNK = 4 * CHUNK


class LanePool:
    """A pool with room for ``lanes`` lanes of ``window`` tokens; ``open`` takes one whole."""

    def __init__(self, model: HybridModel, window: int, lanes: int = 1, page_rows: int = 64,
                 head: bool = False) -> None:
        self.model = model
        self.window = window
        layout = model.layout(page_rows, head)
        device = model.weights.embed.device
        self.pool = Pool(layout, lanes * layout.need(window), device=device)
        self.rows = PageRows(self.pool)
        self.leases: list[Lease] = []

    def open(self) -> LaneMemory:
        lease = self.pool.promise(self.window)
        lease.take_state(init=self.model.init_state)
        lease.take(self.window)
        self.leases.append(lease)
        return LaneMemory(lease.pieces, lease.page_table, lease.host_table)

    def forward(self, spans: Sequence[Span]) -> StackOutput:
        with torch.no_grad():
            return self.model.forward(spans, self.rows)

    def close(self) -> None:
        for lease in self.leases:
            lease.finish()
        self.leases.clear()


@attrs.frozen
class Generated:
    tokens: list[int]
    prefill_s: float
    decode_s: float


def greedy(model: HybridModel, prompt: Sequence[int], max_tokens: int, stop: Sequence[int] = ()) -> Generated:
    """The greedy continuation of ``prompt``: up to ``max_tokens`` tokens, ending at a ``stop`` id."""
    if not prompt:
        raise ValueError("the prompt has no tokens")
    lanes = LanePool(model, len(prompt) + max_tokens)
    try:
        lane = lanes.open()
        device = model.weights.embed.device
        began = time.monotonic()
        ids = torch.tensor(list(prompt), dtype=torch.long, device=device)
        start = 0
        while start < len(prompt):
            end = min(len(prompt), start + PREFILL_CHUNK)
            hidden = lanes.forward([Span(lane, start, ids[start:end])]).hidden
            start = end
        prefilled = time.monotonic()
        out: list[int] = []
        while len(out) < max_tokens:
            token = int(model.logits(hidden[-1:]).argmax(dim=-1))
            out.append(token)
            if token in stop or len(out) == max_tokens:
                break
            step = torch.tensor([token], dtype=torch.long, device=device)
            hidden = lanes.forward([Span(lane, len(prompt) + len(out) - 1, step, decode=True)]).hidden
        return Generated(out, prefilled - began, time.monotonic() - prefilled)
    finally:
        lanes.close()


def row_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """How far logits ``got`` are from the reference's ``want`` [rows, vocab]: the mean over rows of
    |got - want| / |want| (L2 over the vocabulary)."""
    return float(((got - want).norm(dim=-1) / want.norm(dim=-1)).mean())

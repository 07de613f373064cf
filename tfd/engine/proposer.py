"""Drafts from the MTP head: the main model's rows absorbed into the head's cache, then a chain.

The head's cell at position t reads the main model's row t and the token x_(t+1) after it and writes
the head's own K/V row at t (``HybridModel.draft``). A lane's rows are absorbed as they become
final: a prompt chunk's rows (tokens from the prompt, the last one's the token drawn after it), a
verify round's kept rows (tokens the round drew). The cell of the last absorbed row t predicts the
token at t + 2, the first draft; each further draft is a one-row cell at the next position fed the
draft before and the previous cell's carry. Chained cells write speculative head rows that the next
round's absorb writes over before any cell reads them (a cell reads rows up to its own position).

A draft is the head's most likely token; the first is always proposed, each later one only while
the one before had at least ``confidence`` probability (temperature 1). Drafts never change a
lane's tokens, only how many a round keeps, so none of this needs the exactness of the main path.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from tfd.families.hybrid import HybridModel
from tfd.model.memory import LaneMemory, PageRows, Span, ints_on


@attrs.frozen
class Absorb:
    """Rows ``start ..`` of ``lane`` that became final: the main model's rows for them
    (``HybridModel.draft_input`` of the forward that ran them) and, per row, the token after it;
    ``drafts``: how many to chain after the last one (0: only absorb)."""

    lane: LaneMemory
    start: int
    rows: torch.Tensor
    tokens: Sequence[int]
    drafts: int

    @property
    def last(self) -> int:
        """The position of the last absorbed row."""
        return self.start + len(self.tokens) - 1


class HeadProposer:
    """The MTP head of ``model`` over the pool's rows (its layout has the head's row parts)."""

    def __init__(self, model: HybridModel, rows: PageRows, confidence: float) -> None:
        if model.head is None:
            raise ValueError("drafting from the MTP head needs a checkpoint with one")
        self.model = model
        self.rows = rows
        self.confidence = confidence
        self.device = rows.buffer.device

    def propose(self, absorbs: Sequence[Absorb]) -> list[list[int]]:
        """Absorb every lane's rows into the head's cache, then chain each lane's drafts: the
        drafts, a list a lane (empty where none were asked for)."""
        drafts: list[list[int]] = [[] for _ in absorbs]
        if not absorbs:
            return drafts
        spans = [Span(a.lane, a.start, ints_on(a.tokens, self.device)) for a in absorbs]
        cell = self.model.draft(spans, torch.cat([a.rows for a in absorbs]), self.rows)
        ends = torch.tensor([len(a.tokens) for a in absorbs]).cumsum(0) - 1
        going = [i for i, a in enumerate(absorbs) if a.drafts > 0]
        hidden, carry = cell.hidden[ends[going]], cell.carry[ends[going]]
        while going:
            probabilities = torch.softmax(self.model.logits(hidden).float(), dim=-1)
            best, tokens = probabilities.max(dim=-1)
            sure = [p >= self.confidence for p in best.tolist()]
            for i, token in zip(going, tokens.tolist(), strict=True):
                drafts[i].append(int(token))
            keep = [k for k, i in enumerate(going) if sure[k] and len(drafts[i]) < absorbs[i].drafts]
            if not keep:
                break
            going = [going[k] for k in keep]
            # the next cell of each lane: at the position after the last, fed its last draft
            spans = [Span(absorbs[i].lane, absorbs[i].last + len(drafts[i]),
                          ints_on(drafts[i][-1:], self.device)) for i in going]
            picked = ints_on(keep, self.device)
            cell = self.model.draft(spans, carry[picked], self.rows)
            hidden, carry = cell.hidden, cell.carry
        return drafts

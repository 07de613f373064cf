"""Drafts from the MTP head: the main model's rows absorbed into the head's cache, then a chain.

The head's cell at position t reads the main model's row t and the token x_(t+1) after it and writes
the head's own K/V row at t. A lane's rows are absorbed as they become final: a prompt chunk's rows
(``HeadProposer.absorb``: tokens from the prompt, the last one's the token drawn after it), a verify
round's rows (``tfd.engine.rounds``: every row of the window, fed the token drawn after it; rows past
the kept ones are speculative). The cell of the last final row t predicts the token at t + 2, the
first draft; each further draft is a one-row cell at the next position fed the draft before and the
previous cell's carry (``chain``). Speculative head rows are written over before any cell reads them:
a cell reads rows up to its own position, and the next absorb starts at the first row not kept.

A draft is the head's keyed draw: the lane's sampler (its seed, temperature and the drafted token's
position) applied to the head's logits, so head and main model share their noise and a draft holds
wherever their distributions are close (greedy: the head's most likely token). The first is always
proposed, each later one only while the head's most likely token before it had at least
``confidence`` probability (temperature 1). The chain runs on the device
as decode rows (``HybridModel.draft_rows``), with no host sync between its cells, so a verify round
captures it in its graph; the host reads the drafts and how many to propose once. Drafts never change
a lane's tokens, only how many a round keeps, so none of this needs the exactness of the main path.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from tfd.engine.sampling import draw
from tfd.families.hybrid import HybridModel
from tfd.model.decode import DecodeMemory
from tfd.model.decode_batch import FIXED, Columns, DecodeBatch, fields_major, temperature_bits
from tfd.model.memory import LaneMemory, PageRows, Span, ints_on, to_device


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
    seed: int = 0  # the lane's sampling key and temperature: its drafts are drawn as its tokens are
    temperature: float = 0.0

    @property
    def last(self) -> int:
        """The position of the last absorbed row."""
        return self.start + len(self.tokens) - 1


@attrs.frozen
class Chained:
    """A chain's drafts [lanes, most] (int64) and how many of them each lane proposes [lanes]
    (int64, 1 to most), on the device."""

    drafts: torch.Tensor
    proposed: torch.Tensor


def chain(model: HybridModel, memory: DecodeMemory, base: DecodeBatch, hidden: torch.Tensor,
          carry: torch.Tensor, most: int, confidence: float) -> Chained:
    """``most`` drafts a lane of ``base`` (a column a lane at the position t of its last final row;
    its page table; length 0 for a padding lane) from the head's last cell there (``hidden`` and
    ``carry`` [lanes, width]). Device work only. A cell past the page table's last row is kept at that
    row: the lane cannot reach it, its drafts are cut by the host."""
    last = base.columns.pages * memory.pool.layout.page_rows - 1
    if most > 1:  # every chained cell's columns at once (positions t + 1 ..); their tokens come one by one
        packed = base.packed[None].repeat(most - 1, 1, 1)
        ahead = torch.arange(1, most, device=packed.device)[:, None]
        packed[:, 1] = torch.clamp(base.positions[None] + ahead, max=last)
        packed[:, 2] = torch.where(base.lengths[None] > 0, packed[:, 1] + 1, 0)
    drafts, best = [], []
    columns = base
    for step in range(most):
        logits = model.logits(hidden)
        # the cell at position p drafts the token at p + 2: drawn with the key the main model's draw
        # there uses, so the two share their noise and agree wherever their distributions are close
        token = draw(logits, columns.temperature_bits, columns.seeds, columns.positions, 2)
        drafts.append(token)
        if step + 1 == most:  # the last draft's chance decides nothing
            break
        best.append(torch.softmax(logits.float(), dim=-1).amax(dim=-1))
        packed[step, 0] = token
        columns = DecodeBatch(packed[step], base.columns)
        cell = model.draft_rows(columns, memory, carry)
        hidden, carry = cell.hidden, cell.carry
    if most == 1:  # a view and one fill: a one-draft round's chain is its head's draw
        return Chained(drafts[0][:, None], torch.ones_like(drafts[0]))
    sure = (torch.stack(best, dim=1) >= confidence).long()
    return Chained(torch.stack(drafts, dim=1), 1 + sure.cumprod(dim=1).sum(dim=1))


def proposals(found: Chained, wanted: Sequence[int]) -> list[list[int]]:
    """The host's read of ``found`` (one copy): each lane's drafts, at most ``wanted[i]``."""
    rows = torch.cat((found.drafts, found.proposed[:, None]), dim=1).tolist()
    return [row[:min(row[-1], want)] for row, want in zip(rows, wanted, strict=True)]


class HeadProposer:
    """The MTP head of ``model`` over the pool's rows (its layout has the head's row parts); chains
    run as decode rows of ``columns`` through ``memory``."""

    def __init__(self, model: HybridModel, rows: PageRows, memory: DecodeMemory, columns: Columns,
                 confidence: float) -> None:
        if model.head is None:
            raise ValueError("drafting from the MTP head needs a checkpoint with one")
        self.model = model
        self.rows = rows
        self.memory = memory
        self.columns = columns
        self.confidence = confidence
        self.device = rows.buffer.device

    def absorb(self, absorbs: Sequence[Absorb]) -> list[list[int]]:
        """Absorb every lane's rows into the head's cache (span cells, as the prompt ran), then chain
        each lane's drafts: the drafts, a list a lane (empty where none were asked for)."""
        drafts: list[list[int]] = [[] for _ in absorbs]
        if not absorbs:
            return drafts
        spans = [Span(a.lane, a.start, ints_on(a.tokens, self.device)) for a in absorbs]
        cell = self.model.draft(spans, torch.cat([a.rows for a in absorbs]), self.rows)
        going = [i for i, a in enumerate(absorbs) if a.drafts > 0]
        if not going:
            return drafts
        ends = ints_on([sum(len(a.tokens) for a in absorbs[:i + 1]) - 1 for i in going], self.device)
        most = max(absorbs[i].drafts for i in going)
        found = chain(self.model, self.memory, self.base([absorbs[i] for i in going]), cell.hidden[ends],
                      cell.carry[ends], most, self.confidence)
        for i, more in zip(going, proposals(found, [absorbs[i].drafts for i in going]), strict=True):
            drafts[i] = more
        return drafts

    def base(self, absorbs: Sequence[Absorb]) -> DecodeBatch:
        """A column a lane at its last absorbed row: its position, sampling key and page table (no
        offsets: the head reads only its attention rows)."""
        columns, null = self.columns, self.rows.null_page
        fixed = [[0, a.last, a.last + 1, a.seed, temperature_bits(a.temperature), -1, *[-1] * columns.offsets]
                 for a in absorbs]
        packed = torch.full((columns.width, len(absorbs)), null, dtype=torch.int64, device=self.device)
        packed[:FIXED + columns.offsets] = to_device(fields_major(fixed), self.device)
        for i, a in enumerate(absorbs):
            table = a.lane.page_table[:columns.pages]
            packed[columns.table_field:columns.table_field + table.shape[0], i] = table.long()
        return DecodeBatch(packed, columns)

"""A verify round on the device: what ``graphs.RoundGraphs`` captures and ``rounds.Rounds`` runs.

A round's inputs (``RoundInputs``) are its rows' columns, ``rows`` a lane (a window and its padding
rows), each lane's verify offsets, its page table and its last position a window may reach. The
round verifies the windows, draws every row, and then, still on the device: how many rows each
lane keeps, the commit of those rows, the MTP head's cells over the window fed the drawn tokens, the
chain of next drafts from the last kept row (``proposer.chain``), and the next round's inputs
(``tfd_kernels.round_columns.advance``; its page tables, kept counts and fed columns are that module's
launches too), written over its own: the last kept draw as the pending token, the drafts the chain
proposes within the lane's limit, their positions and visible keys. So a round can be launched
before the host has read the one before it (``Rounds``' run ahead), nothing copied in but the page
tables, which may have grown.

Its output is a row a lane, int64: the draws (``rows``), the kept count, the drafts (``most``), how
many of them the chain proposes, and the width of the window it verified.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from tfd.engine.proposer import Chained, chain
from tfd.engine.sampling import draw
from tfd.families.hybrid import HybridModel
from tfd.model.decode import DecodeMemory
from tfd.model.decode_batch import Columns, DecodeBatch, fields_major
from tfd.model.memory import to_device
from tfd.model.verify import VerifyLanes
from tfd_kernels import round_columns


@attrs.frozen
class RoundInputs:
    """``packed`` [columns.width, lanes * rows] (``DecodeBatch``), ``offsets`` [3 x GDN layers,
    lanes] (``VerifyLanes``), ``tables`` [pages, lanes] each lane's page table, ``limits`` [lanes]
    the last position a lane's window may reach (its last draw's position less one): int64 on the
    device."""

    packed: torch.Tensor
    offsets: torch.Tensor
    tables: torch.Tensor
    limits: torch.Tensor

    @classmethod
    def of(cls, held: Sequence[torch.Tensor], device: torch.device) -> RoundInputs:
        """From ``host_inputs`` of all four fields."""
        return cls(*(to_device(value, device) for value in held))

    def copy_(self, held: Sequence[torch.Tensor]) -> None:
        """Overwrite the last ``len(held)`` fields from host tensors (``host_inputs``) without waiting:
        all four, or the page tables and limits of a round run ahead."""
        fields = (self.packed, self.offsets, self.tables, self.limits)[4 - len(held):]
        for field, value in zip(fields, held, strict=True):
            field.copy_(value, non_blocking=True)


def host_inputs(columns: Sequence[Sequence[int]] | None, offsets: Sequence[Sequence[int]] | None,
                tables: Sequence[Sequence[int]], limits: Sequence[int]) -> list[torch.Tensor]:
    """``RoundInputs``' fields as host tensors (pinned where CUDA is there to copy them): all four, or
    without columns and offsets the page tables and limits alone (a round run ahead)."""
    lists = [rows for rows in (columns, offsets) if rows is not None] + [tables]
    held = [fields_major(rows) for rows in lists]
    held.append(torch.tensor(list(limits), dtype=torch.int64))
    return [value.pin_memory() if torch.cuda.is_available() else value for value in held]


class RoundStep:
    """The device side of verify rounds of ``model`` over ``memory``: windows of ``most + 1`` rows
    whose drafts are chained while at least ``confidence`` likely."""

    def __init__(self, model: HybridModel, memory: DecodeMemory, columns: Columns, null_page: int,
                 most: int, confidence: float) -> None:
        self.model = model
        self.memory = memory
        self.columns = columns
        self.null_page = null_page
        self.most = most
        self.confidence = confidence
        device = memory.pool.buffer.device
        self.padding = torch.tensor(columns.padding(null_page), dtype=torch.int64, device=device)
        self.last = columns.pages * memory.pool.layout.page_rows - 1  # the last row a page table holds
        self.ple = model.ple_state() is not None

    def verify(self, batch: DecodeBatch, lanes: VerifyLanes) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row's logits and what the MTP head reads of it; the lanes' states stay committed."""
        output = self.model.verify(batch, self.memory, lanes)
        return self.model.draft_input(output), self.model.logits(output.hidden)

    def step(self, inputs: RoundInputs) -> torch.Tensor:
        """A round whose rows draw plainly, all on the device, its inputs advanced to the next round's."""
        rows = self.most + 1
        batch = DecodeBatch(inputs.packed, self.columns)
        fused = inputs.packed.is_cuda
        # each live row reads its lane's page table as it is now (a round run ahead got it copied in)
        (round_columns.tables if fused else round_columns.reference_tables)(
            inputs.packed, inputs.tables, rows, self.columns.table_field, self.null_page)
        lanes = VerifyLanes(rows, inputs.offsets, self.ple)
        previous, logits = self.verify(batch, lanes)
        drawn = draw(logits, batch.temperature_bits, batch.seeds, batch.positions, 1)
        kept, found = self.settle(batch, lanes, previous, drawn)
        advance = round_columns.advance if fused else round_columns.reference_advance
        return advance(inputs.packed, drawn, kept, found.drafts, found.proposed, inputs.limits, self.padding,
                       self.last)

    def settle(self, batch: DecodeBatch, lanes: VerifyLanes, previous: torch.Tensor, drawn: torch.Tensor
               ) -> tuple[torch.Tensor, Chained]:
        """After the draws (``drawn`` [lanes * rows]): each lane's kept rows counted and committed,
        the head's cells over its window (from ``previous``, what the head reads of each row), the
        next drafts chained from the last kept row. Returns the kept counts [lanes] and the chain."""
        keep = round_columns.keep if batch.packed.is_cuda else round_columns.reference_keep
        kept, kept32, last, fed, base = keep(batch.packed, drawn, lanes.rows)
        self.model.commit(batch, self.memory, lanes, kept32)
        cells = self.model.draft_rows(DecodeBatch(fed, self.columns), self.memory, previous)
        hidden = cells.hidden[last]
        carry = hidden if cells.carry is cells.hidden else cells.carry[last]  # Qwen's carry is its hidden
        found = chain(self.model, self.memory, DecodeBatch(base, self.columns), hidden, carry, self.most,
                      self.confidence)
        return kept, found

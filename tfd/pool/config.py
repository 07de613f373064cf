"""The pool's settings for one family, read from the environment table."""

from __future__ import annotations

import attrs

from tfd.env import Settings, family_scope
from tfd.env_kinds import Integer
from tfd.pool.layout import Mode
from tfd.pool.pieces import PieceOverPage

GIB = 1 << 30
CPU_POOL_BYTES = GIB // 4  # the pool on the CPU when TF_POOL_GIB is unset
# With pages off a lane's rows and state are one run of pages of this many rows.
PAGE_ROWS_WHEN_OFF = 256
# Family scopes that have rows of their own for the pool: (rows per page, states as pieces).
FAMILY_ROWS = {"flashnext": ("TF_FLASHNEXT_KV_PAGES", "TF_FLASHNEXT_STATE_PAGES")}
CORE_ROWS = ("TF_KV_PAGES", "TF_STATE_PAGES")


@attrs.frozen
class PoolConfig:
    page_rows: int
    mode: Mode
    memory_limit: int | None  # bytes of a GPU tfd plans with (TF_CUDA_MEMORY_LIMIT_GB); None: what is free
    size: int | None = None  # the pool's bytes (TF_POOL_GIB); None: the CPU default, or a GPU's plan
    rows_name: str = "TF_KV_PAGES"  # the row that set page_rows (a family's own where it has one)

    @classmethod
    def from_settings(cls, settings: Settings, family: str) -> PoolConfig:
        """The pool of ``family`` (a scope or a ``model_type``), whose rows must be checked."""
        rows_name, pieces_name = FAMILY_ROWS.get(family_scope(family), CORE_ROWS)
        rows = settings.value(rows_name, int)
        pieces = settings.value(pieces_name, bool)
        limit = settings.optional("TF_CUDA_MEMORY_LIMIT_GB", float)
        memory_limit = None if limit is None else int(limit * GIB)
        pool = settings.optional("TF_POOL_GIB", float)
        size = None if pool is None else int(pool * GIB)
        if rows == 0:
            return cls(PAGE_ROWS_WHEN_OFF, Mode.ONE_RUN, memory_limit, size, rows_name)
        return cls(rows, Mode.PIECES if pieces else Mode.STATE_RUN, memory_limit, size, rows_name)

    def over_page(self, error: PieceOverPage, settings: Settings) -> str:
        """The refusal of a page too small for a piece: the row, and its least legal value that
        holds the piece (a multiple of the row's step), or that none up to its greatest does. A
        family's row that took its value from the core row names that one too."""
        row = settings.table.by_name()[self.rows_name]
        kind = row.kind
        rows = error.smallest_rows or self.page_rows
        step, high = (kind.step, kind.high) if isinstance(kind, Integer) else (1, rows)
        least = -(-rows // step) * step
        value = settings.value(self.rows_name, int)
        parent = row.inherits if settings.source(self.rows_name) == "inherited" else None
        given = f" (as {parent}={value})" if parent else ""
        fits = f"{self.rows_name}={least}{f' (or {parent}={least})' if parent else ''} is the least that " \
            "holds it" if least <= high else f"no {self.rows_name} up to {high} holds it"
        return (f"{self.rows_name}={value}{given}: the piece {error.piece} needs {error.nbytes} bytes, more "
                f"than a page of {error.page_bytes} bytes ({self.page_rows} rows); {fits}")

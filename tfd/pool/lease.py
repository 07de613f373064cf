"""A lane's lease on the pool's pages and a kept state's hold on some: how pages leave the pool and
come back (``tfd.pool.pages.Pool`` makes both; ``Pool.promise`` a lease, ``Pool.hold``/``Pool.keep`` a hold).

Resource handling: every lease operation either completes or leaves the pool as it was, whatever it raises
(``BaseException`` included); ``Lease.finish`` and ``PageHold.release`` are idempotent. Not thread-safe: the
pool's owner calls them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs
import numpy as np
import torch

from tfd.pool.errors import LeaseFinished, OverPromise, PoolError
from tfd.pool.layout import Mode
from tfd.pool.pieces import Piece, PieceMap
from tfd.pool.views import place as place_on
from tfd.pool.views import zero_pages

if TYPE_CHECKING:
    from tfd.pool.pages import Pool

StateInit = Callable[[Mapping[str, torch.Tensor]], None]  # writes a fresh lane's nonzero state


@attrs.frozen
class Holding:
    """What a lane holds now and may still take from its promise."""

    row_pages: int
    state_pages: int
    may_take: int

class PageHold:
    """A kept state's holder of some pages (its ``own`` first, taken for it, then shared ones);
    ``release`` gives them back, once."""

    def __init__(self, pool: Pool, pages: tuple[int, ...], own: int = 0) -> None:
        self.pool = pool
        self.pages = pages
        self.own = pages[:own]
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.pool._pages.give_held(self.pages)


class Lease:
    """One lane's hold on the pool: its promise, its row pages, its state pages and views."""

    def __init__(self, pool: Pool, lane: int, window: int, promised: int) -> None:
        self.pool = pool
        self.lane = lane
        self.window = window
        self.promised = promised
        self.row_pages: list[int] = []
        self.state_pages: list[int] = []
        self.finished = False
        self._pieces: Mapping[str, torch.Tensor] | None = None
        layout = pool.layout
        self._table = torch.full((layout.row_pages(window),), pool.null_page, dtype=torch.int32,
                                 device=pool.buffer.device)
        self._host = np.full(self._table.shape, pool.null_page, dtype=np.int32)  # the table's ids as written

    @property
    def holds(self) -> Holding:
        return Holding(len(self.row_pages), len(self.state_pages), self.promised)

    @property
    def page_table(self) -> torch.Tensor:
        """int32 page ids of the lane's rows, in row order; ``null_page`` where none is taken."""
        self._alive()
        return self._table

    @property
    def host_table(self) -> np.ndarray:
        """``page_table``'s ids on the host, kept as its copies are queued (so a prompt pass reads them
        without waiting for the device); the caller only reads it. The same array for the lease's life."""
        self._alive()
        return self._host

    @property
    def pieces(self) -> Mapping[str, torch.Tensor]:
        """The lane's state pieces as typed views into the pool's buffer (no copies)."""
        self._alive()
        if self._pieces is None:
            raise PoolError(f"lane {self.lane} has no state yet: take_state or claim_run first")
        return self._pieces

    def take(self, rows: int) -> None:
        """Hold pages for the first ``rows`` token rows; pages come from the promise."""
        self._alive()
        layout = self.pool.layout
        want = layout.row_pages(rows)
        if rows > self.window:
            raise OverPromise(f"lane {self.lane} asked for {rows} rows; its window is {self.window}")
        if self.pool.mode is Mode.ONE_RUN and self._pieces is None:
            raise PoolError(f"lane {self.lane}: with pages off, claim_run holds the rows; call it first")
        extra = want - len(self.row_pages)
        if extra <= 0:
            return
        pages = self.pool._pages.take_lowest(extra)
        try:
            self._write_table(len(self.row_pages), pages)
        except BaseException:
            self.pool._pages.give(pages)
            raise
        self.row_pages += pages
        self._spend(extra)

    def adopt(self, pages: Sequence[int]) -> None:
        """Make a kept state's row pages this lane's first ones, shared (the lane never writes rows
        before the kept position): before any row page is taken; they were not promised."""
        self._alive()
        if self.row_pages or self.pool.mode is Mode.ONE_RUN:
            raise PoolError(f"lane {self.lane} can adopt row pages only first, and not with pages off")
        if len(pages) > self.pool.layout.row_pages(self.window):
            raise OverPromise(f"lane {self.lane} adopts {len(pages)} row pages; its window holds "
                              f"{self.pool.layout.row_pages(self.window)}")
        pages = list(pages)
        self.pool._pages.share(pages)
        try:
            self._write_table(0, pages)
        except BaseException:
            self.pool._pages.give(pages)
            raise
        self.row_pages = pages

    def take_state(self, init: StateInit | None = None) -> Mapping[str, torch.Tensor]:
        """Take the state pages (any free pages, lowest first) and place the pieces on them.

        The pages are zeroed (a fill a run of consecutive pages: ``tfd.pool.views``), then ``init``
        writes what of the initial state is not zero. Whatever raises, the pages go back and the
        lease stays as before.
        """
        return self._open_state(self.pool._pages.take_lowest, init)

    def claim_run(self, init: StateInit | None = None) -> Mapping[str, torch.Tensor]:
        """Like ``take_state`` on one consecutive run of pages; raises ``NoRun`` when none is
        long enough. In ``Mode.ONE_RUN`` the run also holds every row page of the window."""
        return self._open_state(self.pool._pages.take_run, init)

    def open(self, init: StateInit | None = None) -> Mapping[str, torch.Tensor]:
        """Take the state the way the pool's mode says."""
        if self.pool.mode is Mode.PIECES:
            return self.take_state(init)
        return self.claim_run(init)

    def finish(self) -> None:
        """Give back every page and what remains of the promise; again is a no-op."""
        if self.finished:
            return
        self.finished = True
        pool = self.pool
        pool._pages.give(self.row_pages + self.state_pages)
        pool._promised -= self.promised
        del pool._leases[self.lane]
        self.promised = 0
        self.row_pages, self.state_pages, self._pieces = [], [], None

    def _open_state(self, take: Callable[[int], list[int]], init: StateInit | None
                    ) -> Mapping[str, torch.Tensor]:
        self._alive()
        if self._pieces is not None:
            raise PoolError(f"lane {self.lane} already holds its state")
        layout = self.pool.layout
        with_rows = self.pool.mode is Mode.ONE_RUN
        rows = layout.row_pages(self.window) if with_rows else 0
        pages = take(layout.state_pages + rows)
        try:
            state, row = pages[:layout.state_pages], pages[layout.state_pages:]
            views = place(self.pool, layout.piece_map, layout.pieces, state)
            zero_pages(self.pool.buffer, layout.page_bytes, state)
            if init is not None:
                init(views)
        except BaseException:
            self.pool._pages.give(pages)
            raise
        self.state_pages = state
        if row:
            self._write_table(0, row)
            self.row_pages = row
        self._spend(len(pages))
        self._pieces = views
        return views

    def _write_table(self, start: int, pages: list[int]) -> None:
        """Page ids into the device table from ``start``, queued behind the device's work: from
        the device's pinned ring on CUDA (``tfd.pool.staging``), so the host does not wait for the steps in
        flight."""
        into, held = self._table[start:start + len(pages)], self._host[start:start + len(pages)]
        held[:] = pages
        if self.pool._together is not None:  # tables_together: written with the others on leaving
            self.pool._together.append((into, held.copy()))
        elif self.pool.staging is not None:
            self.pool.staging.write(into, held)
        else:
            into.copy_(torch.from_numpy(held))

    def _spend(self, count: int) -> None:
        if count > self.promised:  # the promise was counted wrong: a bug, not a refusal
            raise OverPromise(f"lane {self.lane} took {count} pages with {self.promised} promised")
        self.promised -= count
        self.pool._promised -= count

    def _alive(self) -> None:
        if self.finished:
            raise LeaseFinished(f"lane {self.lane} is finished")


def place(pool: Pool, piece_map: PieceMap, pieces: Iterable[Piece], pages: list[int]
          ) -> Mapping[str, torch.Tensor]:
    """Typed views of ``pieces`` at their map's places on the pool pages ``pages``: for a tuple of pieces
    (a layout's, a kept state's: the same tuple each time) by the pool's ``Stamp``, each view made when
    first asked for (``tfd.pool.views.PieceViews``)."""
    if isinstance(pieces, tuple):
        return pool.stamp(piece_map, pieces).views(pages)
    return place_on(pool.typed, pool.layout.page_bytes, pool.placements(piece_map), pieces, pages)

"""The pool: all memory after the weights as equal pages in one byte tensor, lent to lanes by lease.

A lane is promised the pages its window needs at admission (``Pool.promise``); it takes its state
pages (``Lease.take_state``: any free pages, pieces placed by the layout's map; or
``Lease.claim_run``: one consecutive run) and takes row pages as its rows grow (``Lease.take``);
``Lease.finish`` gives everything back. Pages go out lowest id first. The pool never promises more
than it has, so a take within the promise cannot fail for want of pages.

Resource handling: every lease operation either completes or leaves the pool as it was, whatever
it raises (``BaseException`` included); ``finish`` is idempotent. One owner at a time: the pool is
not thread-safe. The last page (``null_page``) is never lent: unmapped page-table entries point at
it and it stays zero.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import attrs
import numpy as np
import torch

from tfd.pool.errors import Leak, LeaseFinished, OverPromise, PoolError, PoolShort
from tfd.pool.free import FreePages
from tfd.pool.layout import Layout, Mode
from tfd.pool.pieces import Piece, PieceMap, Placement, check
from tfd.pool.staging import ring_for
from tfd.pool.views import TORCH_DTYPES, Stamp, TypedBytes, zero_pages
from tfd.pool.views import place as place_on

# --parallel auto's most lanes: the largest decode graph (tfd.engine.graphs.BUCKETS); more lanes
# would wait on each other's rows in every step for little more throughput.
AUTO_LANES_MOST = 256

StateInit = Callable[[Mapping[str, torch.Tensor]], None]  # writes a fresh lane's nonzero state


@attrs.frozen
class LaneCensus:
    row_pages: int
    state_pages: int
    promised: int


@attrs.frozen
class Census:
    """What lanes hold: pages free for them (those only kept prompt states hold included: evicting
    frees them), pages promised, each lane's, and whether the null page is still zero. Kept
    states' own books are ``Pool.kept_pages`` and the prompt cache's report."""

    free: int
    promised: int
    lanes: tuple[tuple[int, LaneCensus], ...]
    null_clean: bool

    def as_dict(self) -> dict[str, object]:
        return {"free": self.free, "promised": self.promised, "null_clean": self.null_clean,
                "lanes": {lane: attrs.asdict(held) for lane, held in self.lanes}}


@attrs.frozen
class Holding:
    """What a lane holds now and may still take from its promise."""

    row_pages: int
    state_pages: int
    may_take: int


class Pool:
    """Pages of ``layout.page_bytes`` in one byte tensor on ``device``.

    ``max_lanes`` bounds the leases at once (each lane's bytes outside the pool were set aside for
    that many); None: only pages bound them.
    """

    def __init__(self, layout: Layout, pages: int, *, mode: Mode = Mode.PIECES,
                 max_lanes: int | None = None, device: torch.device | str = "cpu") -> None:
        if pages <= 0:
            raise ValueError(f"a pool needs at least one page, got {pages}")
        check(layout.piece_map)
        self.layout = layout
        self.pages = pages
        self.mode = mode
        self.max_lanes = max_lanes
        self.null_page = pages
        self.buffer = torch.zeros((pages + 1) * layout.page_bytes, dtype=torch.uint8, device=device)
        self.typed = TypedBytes(self.buffer)
        self.staging = ring_for(self.buffer.device) if self.buffer.is_cuda else None  # page ids to the device
        self._placements: dict[int, tuple[PieceMap, Mapping[str, Placement]]] = {}
        self._stamps: dict[int, tuple[PieceMap, tuple[Piece, ...], Stamp]] = {}
        self._pages = FreePages(pages)
        self._promised = 0
        self._leases: dict[int, Lease] = {}
        self._next_lane = 0
        self._together: list[tuple[torch.Tensor, np.ndarray]] | None = None  # tables_together's writes
        self.at_load = self.census()

    @classmethod
    def for_limit(cls, layout: Layout, memory_limit: int, window: int, *, parallel: int | None = None,
                  mode: Mode = Mode.PIECES, device: torch.device | str = "cpu") -> Pool:
        """A pool filling ``memory_limit`` bytes, with lane slots for ``parallel`` lanes of ``window``.

        ``parallel`` None is ``--parallel auto``: as many lanes as ``layout.plan`` fits, at most
        ``AUTO_LANES_MOST``; the pages all lanes do not need are the prompt cache's. An explicit
        count that does not fit raises ``PoolShort`` naming what fits.
        """
        fits = layout.plan(window, memory_limit)
        lanes = min(fits, AUTO_LANES_MOST) if parallel is None else parallel
        if lanes > fits or lanes <= 0:
            raise PoolShort(f"{lanes} lanes of {window} tokens do not fit {memory_limit} bytes: "
                            f"{fits} fit, each needing {layout.lane_bytes(window)} bytes")
        pages = (memory_limit - lanes * layout.fixed_bytes) // layout.page_bytes - 1  # the null page
        return cls(layout, pages, mode=mode, max_lanes=lanes, device=device)

    @contextlib.contextmanager
    def tables_together(self) -> Iterator[None]:
        """Inside, the leases' page-table writes wait and go to the device together on leaving (on CUDA one
        copy and one device copy into every table: ``HostStaging.write_many``), whatever raised; the host
        tables (``Lease.host_table``) follow each write at once. For a step's lanes taking pages one after
        another, whose copies each left the device idle. Not reentrant (RuntimeError)."""
        if self._together is not None:
            raise RuntimeError("the pool's page-table writes are gathered already")
        self._together = []
        try:
            yield
        finally:
            gathered, self._together = self._together, None
            if self.staging is not None:
                self.staging.write_many(gathered)
            else:
                for dest, values in gathered:
                    dest.copy_(torch.from_numpy(values))

    @property
    def free(self) -> int:
        return self._pages.count

    @property
    def available(self) -> int:
        """Free pages nobody was promised: what a new admission may count on."""
        return self._pages.count - self._promised

    @property
    def leases(self) -> Mapping[int, Lease]:
        return dict(self._leases)

    @property
    def kept_pages(self) -> int:
        """Pages only kept states hold (the census counts them free)."""
        return self._pages.kept

    @property
    def held_pages(self) -> int:
        """Pages some kept state holds, lanes' shared rows included: what kept states cost."""
        return self._pages.held

    @property
    def has_slot(self) -> bool:
        """Whether a lane slot is free (``max_lanes``)."""
        return self.max_lanes is None or len(self._leases) < self.max_lanes

    def can_promise(self, window: int, adopted: int = 0) -> bool:
        """Whether a lane of ``window`` tokens, ``adopted`` of its row pages a kept state's, may be
        admitted now."""
        return self.has_slot and self.layout.need(window) - adopted <= self.available

    def promise(self, window: int, adopted: int = 0) -> Lease:
        """Admit a lane of ``window`` tokens: promise the pages it needs, less ``adopted`` row pages
        it will share with a kept state (``Lease.adopt``), or raise ``PoolShort``."""
        need = self.layout.need(window) - adopted
        if not self.has_slot:
            raise PoolShort(f"all {self.max_lanes} lane slots are taken")
        if need > self.available:
            raise PoolShort(f"a lane of {window} tokens needs {need} pages; {self.available} of "
                            f"{self.pages} are free and unpromised")
        lease = Lease(self, self._next_lane, window, need)
        self._next_lane += 1
        self._promised += need
        self._leases[lease.lane] = lease
        return lease

    def census(self) -> Census:
        lanes = tuple((lane, LaneCensus(len(lease.row_pages), len(lease.state_pages), lease.promised))
                      for lane, lease in sorted(self._leases.items()))
        null = self.page_bytes_view(self.null_page)
        return Census(self.free + self._pages.kept, self._promised, lanes, not bool(null.any()))

    def hold(self, pages: Iterable[int]) -> PageHold:
        """Keep ``pages`` (taken by some lane or kept state) from going free until the hold is
        released: a kept prompt state shares a lane's full row pages this way; they outlive it."""
        pages = tuple(pages)
        self._pages.hold(pages)
        return PageHold(self, pages)

    def keep(self, own: int, shared: Sequence[int]) -> PageHold:
        """A kept state's pages: ``own`` free unpromised pages (lowest first) and a hold on ``shared``
        ones; ``PoolShort`` (nothing taken) when fewer than ``own`` are available."""
        if own > self.available:
            raise PoolShort(f"a kept state needs {own} pages; {self.available} are free and unpromised")
        shared = tuple(shared)
        self._pages.hold(shared)
        try:
            taken = self._pages.take_lowest(own)
        except BaseException:
            self._pages.give_held(shared)
            raise
        self._pages.mark_held(taken)
        return PageHold(self, (*taken, *shared), own=len(taken))

    def check_at_load(self) -> None:
        """Raise ``Leak`` describing the difference when the census is not the one at load."""
        now = self.census()
        if now != self.at_load:
            raise Leak(f"LEAK: census {now.as_dict()} differs from the census at load "
                       f"{self.at_load.as_dict()}")

    def placements(self, piece_map: PieceMap) -> Mapping[str, Placement]:
        """``piece_map``'s placements by name, made once a map (a pool sees two: lanes', kept states')."""
        held = self._placements.get(id(piece_map))
        if held is None or held[0] is not piece_map:
            held = self._placements[id(piece_map)] = (piece_map, piece_map.by_name())
        return held[1]

    def stamp(self, piece_map: PieceMap, pieces: tuple[Piece, ...]) -> Stamp:
        """``pieces``' views at ``piece_map``'s places worked out once (``tfd.pool.views.Stamp``), made once
        a map and piece tuple."""
        held = self._stamps.get(id(piece_map))
        if held is None or held[0] is not piece_map or held[1] is not pieces:
            stamp = Stamp(self.typed, self.layout.page_bytes, self.placements(piece_map), pieces)
            held = self._stamps[id(piece_map)] = (piece_map, pieces, stamp)
        return held[2]

    def page_bytes_view(self, page: int) -> torch.Tensor:
        size = self.layout.page_bytes
        return self.buffer[page * size:(page + 1) * size]

    def rows(self, part: str) -> torch.Tensor:
        """A row part over every page, as ``[pages + 1, entries per page, *shape]``; a view."""
        found = [p for p in self.layout.row_parts if p.name == part]
        if not found:
            raise KeyError(f"no row part {part!r}")
        row_part = found[0]
        offset = self.layout.part_offsets[part]
        entries = self.layout.page_rows // row_part.rows
        pages = self.buffer.view(self.pages + 1, self.layout.page_bytes)
        region = pages[:, offset:offset + entries * row_part.entry_bytes]
        return region.view(TORCH_DTYPES[row_part.dtype]).view(self.pages + 1, entries, *row_part.shape)


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

"""Which pages are free: lowest id first, consecutive runs, and holders per page.

A page taken has one holder; ``share`` adds one (a lane resuming a kept prompt state's rows),
``hold`` adds one that is a kept state's (``held`` counts those a page), ``give`` removes a holder
and ``give_held`` a kept state's; a page is free again when none is left. A page only kept states
hold is ``kept``: no lane needs it, evicting them frees it. Not thread-safe.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterable

from tfd.pool.errors import NoRun, PoolShort


class FreePages:
    def __init__(self, pages: int) -> None:
        self.pages = pages
        self._is_free = bytearray(b"\x01") * pages  # bytes, so a run is one find()
        self._holders = array("I", bytes(4 * pages))
        self._held = array("I", bytes(4 * pages))  # of the holders, how many are kept states
        self.kept = 0  # pages only kept states hold
        self.held = 0  # pages some kept state holds
        self._heap = list(range(pages))  # may keep ids taken since; _is_free decides
        self.count = pages

    def take_lowest(self, count: int) -> list[int]:
        """The ``count`` lowest free pages; ``PoolShort`` when fewer are free."""
        if count > self.count:
            raise PoolShort(f"{count} pages wanted, {self.count} free")
        taken: list[int] = []
        while len(taken) < count:
            page = heapq.heappop(self._heap)
            if self._is_free[page]:
                taken.append(page)
                self._mark_taken(page)
        self.count -= count
        return taken

    def take_run(self, count: int) -> list[int]:
        """The lowest run of ``count`` consecutive free pages; ``NoRun`` when there is none."""
        start = self._is_free.find(b"\x01" * count)
        if start < 0:
            raise NoRun(f"no run of {count} consecutive free pages ({self.count} pages are free)")
        pages = list(range(start, start + count))
        for page in pages:
            self._mark_taken(page)
        self.count -= count
        return pages

    def share(self, pages: Iterable[int]) -> None:
        """One more holder of each page; each must be taken already."""
        self._add(list(pages), 0)

    def hold(self, pages: Iterable[int]) -> None:
        """``share``, the new holder a kept state."""
        self._add(list(pages), 1)

    def mark_held(self, pages: Iterable[int]) -> None:
        """Pages just taken (their one holder) are a kept state's."""
        for page in pages:
            assert self._holders[page] == 1 and not self._held[page]
            self._change(page, 0, 1)

    def give(self, pages: Iterable[int]) -> None:
        """One holder less of each page; a page left with none is free again."""
        for page in pages:
            if not self._holders[page]:
                raise AssertionError(f"page {page} given back more often than taken")
            if self._held[page] == self._holders[page]:
                raise AssertionError(f"page {page}: a lane gave back a page only kept states hold")
            self._change(page, -1, 0)
        self._tidy()

    def give_held(self, pages: Iterable[int]) -> None:
        """A kept state's holder less of each page."""
        for page in pages:
            if not self._held[page]:
                raise AssertionError(f"page {page} given back by a kept state that does not hold it")
            self._change(page, -1, -1)
        self._tidy()

    def _add(self, pages: list[int], held: int) -> None:
        idle = [page for page in pages if not self._holders[page]]
        if idle:
            raise ValueError(f"pages {idle[:8]} are free: only taken pages can be held")
        for page in pages:
            self._change(page, 1, held)

    def _change(self, page: int, holders: int, held: int) -> None:
        """A page's holders and kept holders moved by the deltas; the counts of pages kept states
        hold (``held``) and only they hold (``kept``) follow; a page left with no holder is free."""
        was_kept = bool(self._holders[page]) and self._holders[page] == self._held[page]
        was_held = bool(self._held[page])
        self._holders[page] += holders
        self._held[page] += held
        now_kept = bool(self._holders[page]) and self._holders[page] == self._held[page]
        self.kept += now_kept - was_kept
        self.held += bool(self._held[page]) - was_held
        if not self._holders[page]:
            self._is_free[page] = 1
            heapq.heappush(self._heap, page)
            self.count += 1

    def _tidy(self) -> None:
        if len(self._heap) > 2 * self.pages:  # entries of pages a run took: drop them
            self._heap = [page for page in range(self.pages) if self._is_free[page]]

    def holders(self, page: int) -> int:
        return self._holders[page]

    def _mark_taken(self, page: int) -> None:
        self._is_free[page] = 0
        self._holders[page] = 1

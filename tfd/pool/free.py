"""Which pages are free: lowest id first, consecutive runs, and holders per page.

A page taken has one holder; ``hold`` adds holders (a kept prompt state sharing a lane's rows),
``give`` removes one, and the page is free again when none is left. Not thread-safe.
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

    def hold(self, pages: Iterable[int]) -> None:
        """One more holder of each page; each must be taken already."""
        pages = list(pages)
        idle = [page for page in pages if not self._holders[page]]
        if idle:
            raise ValueError(f"pages {idle[:8]} are free: only taken pages can be held")
        for page in pages:
            self._holders[page] += 1

    def give(self, pages: Iterable[int]) -> None:
        """One holder less of each page; a page left with none is free again."""
        for page in pages:
            if not self._holders[page]:
                raise AssertionError(f"page {page} given back more often than taken")
            self._holders[page] -= 1
            if not self._holders[page]:
                self._is_free[page] = 1
                heapq.heappush(self._heap, page)
                self.count += 1
        if len(self._heap) > 2 * self.pages:  # entries of pages a run took: drop them
            self._heap = [page for page in range(self.pages) if self._is_free[page]]

    def holders(self, page: int) -> int:
        return self._holders[page]

    def _mark_taken(self, page: int) -> None:
        self._is_free[page] = 0
        self._holders[page] = 1

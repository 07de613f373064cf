"""Kept prompt states in memory: a lane's state at a prompt position, kept on the pool's pages.

A kept state at position p holds what a lane needs to go on from p as a fresh prefill would: its
rows before p (the full row pages shared with the lane that kept it, by a hold on them; the page p
falls in copied, as it will be written past p; with pages off, every row page copied), its own state
pieces copied (GDN states and conv tails, Flash Next's PLE tail and n-gram history) and, kept from a
drafting lane, the MTP head's rows (on the same pages). It is named by the prompt's first p tokens
(``tfd.cache.prefixes``) and the token at p: the head's row p - 1 was absorbed with that token, and
a lane resuming at p prefills from it, so a match leaves at least that row to run.

``KeptStates`` is the prompt cache's memory tier: ``match`` finds the longest kept state a prompt
extends (one with the head's rows for a drafting lane), ``resume`` copies it into a lane's lease and
memory just opened, ``keep`` copies a lane's state after a prompt chunk ended at a keep point. Least
recently used states go first: past the byte budget, when a keep or an admission needs pages, on
``evict``.

Resource handling: every page a kept state holds is in its ``PageHold``; eviction releases it, and a
keep that fails releases what it took before raising. Device copies are queued on the current stream,
behind the step that wrote the lane's state and ahead of the next one, so nothing waits. Owned by the
engine thread, like the pool.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence

import attrs
import torch

from tfd.cache.prefixes import Key, Prefixes
from tfd.model.memory import LaneMemory
from tfd.pool.layout import Mode
from tfd.pool.pages import Lease, PageHold, Pool, place
from tfd.pool.pieces import Piece, PieceMap, pack


@attrs.frozen
class Places:
    """Where the state pieces lie on a kept state's own pages: one for every state of a cache."""

    map: PieceMap
    pieces: tuple[Piece, ...]


@attrs.define(eq=False)
class KeptState:
    """A lane's state at ``position``; ``head``: the MTP head's rows are there too."""

    key: Key
    head: bool
    hold: PageHold
    places: Places  # its state pieces' places on the hold's own pages
    shared: tuple[int, ...]  # row pages a resuming lane adopts (its first ones)
    copied: tuple[tuple[int, int], ...]  # (row page index, own page) a resuming lane copies
    ready: object = None  # on CUDA, an event after the copies that made it (a disk write waits for it)
    writing: bool = False  # being written to disk: its pages are released once the write is done
    dropped: bool = False  # evicted while writing

    @property
    def position(self) -> int:
        return self.key[0]

    @property
    def pieces(self) -> Mapping[str, torch.Tensor]:
        """The state pieces, viewed when asked: kept, a state's dozens of tensor views took ~42 KiB
        (the 9B shape's), and the H200's 8-minute soak grew 62 MiB resident as its cache filled."""
        own = list(self.hold.own[:self.places.map.pages])
        return place(self.hold.pool, self.places.map, self.places.pieces, own)


@attrs.define
class KeptCounts:
    """What the prompt cache did: lanes that resumed and that found nothing, states kept, evicted,
    and keeps refused (no pages, or over the budget alone)."""

    hits: int = 0
    misses: int = 0
    kept: int = 0
    evicted: int = 0
    refused: int = 0
    resumed_tokens: int = 0


class KeptStates:
    """Kept states on ``pool``'s pages within ``budget`` bytes (pages any of them holds, counted
    once); ``pieces``: a lane's state pieces to keep (not verify's buffers); ``gain``: the tokens a
    resumed lane prefills past its state before it keeps another (``PromptCache.start``)."""

    def __init__(self, pool: Pool, pieces: Sequence[Piece], budget: int, gain: int = 0) -> None:
        if budget <= 0:
            raise ValueError(f"a prompt cache needs a positive budget, got {budget} bytes")
        self.pool = pool
        self.pieces = tuple(pieces)
        self.map = pack(self.pieces, pool.layout.page_bytes)
        self.places = Places(self.map, self.pieces)
        self.budget = budget
        self.gain = gain
        self.states: collections.OrderedDict[Key, KeptState] = collections.OrderedDict()  # oldest first
        self.counts = KeptCounts()

    @property
    def bytes(self) -> int:
        return self.pool.held_pages * self.pool.layout.page_bytes

    def state_bytes(self, position: int) -> int:
        """What a state kept at ``position`` costs the budget: its pieces' pages and its rows'."""
        layout = self.pool.layout
        return (self.map.pages + -(-position // layout.page_rows)) * layout.page_bytes

    def match(self, prompt: Prefixes, head: bool) -> KeptState | None:
        """The longest kept state ``prompt`` extends past (with the head's rows when ``head``), or
        None. A match becomes the newest."""
        for key in prompt.resume_keys():
            state = self.states.get(key)
            if state is not None and (state.head or not head):
                self.states.move_to_end(state.key)
                return state
        return None

    def admission(self, prompt: Prefixes, window: int, head: bool) -> KeptState | None:
        """The state a waiting lane of ``prompt`` resumes from (``match``), once the kept states in
        the way of its ``window`` are evicted, least recently used first. Nothing is evicted when
        that cannot make room (lanes hold the pages or the lane slots: the lane waits); the match
        itself goes only when nothing else would make room and no lane runs to free pages (then
        None)."""
        state = self.match(prompt, head)
        adopted = 0 if state is None else len(state.shared)
        if not self.pool.has_slot or \
                self.pool.layout.need(window) - adopted > self.pool.available + self.pool.kept_pages:
            return state  # evicting cannot make room: the lane waits for lanes to finish
        if self.make_room(0, state, window, adopted) or state is None or self.pool.leases:
            return state
        self.evict(state)
        return None

    def resume(self, lease: Lease, memory: LaneMemory, state: KeptState) -> int:
        """Give a lane just opened (``lease``: its state pieces taken, no row page yet; ``memory``:
        their views) ``state``'s rows and pieces; where the lane goes on from."""
        if state.shared:
            lease.adopt(state.shared)
        for name, view in state.pieces.items():
            memory.pieces[name].copy_(view)
        if state.copied:
            lease.take(state.position)
            for index, page in state.copied:
                self.pool.page_bytes_view(lease.row_pages[index]).copy_(self.pool.page_bytes_view(page))
        self.counts.hits += 1
        self.counts.resumed_tokens += state.position
        return state.position

    def keep(self, prompt: Prefixes, lease: Lease, memory: LaneMemory, position: int, head: bool
             ) -> KeptState | None:
        """Keep the state of a lane of ``prompt`` (``lease`` and ``memory``) now that its prefill
        reached ``position`` (a keep point); ``head``: its MTP head's rows are written. None when it
        could not be kept (counted refused) or a state as good is kept already."""
        key = prompt.key_at(position)
        known = self.states.get(key)
        if known is not None and (known.head or not head):
            self.states.move_to_end(key)
            return None
        rows = self.pool.layout.page_rows
        full = position // rows
        share = self.pool.mode is not Mode.ONE_RUN
        shared = tuple(lease.row_pages[:full]) if share else ()
        copies = list(range(full if share else 0, -(-position // rows)))
        own = self.map.pages + len(copies)
        if not self.make_room(own, spare=known):
            self.counts.refused += 1
            return None
        hold = self.pool.keep(own, shared)
        try:
            views = place(self.pool, self.map, self.pieces, list(hold.own[:self.map.pages]))
            for name, view in views.items():
                view.copy_(memory.pieces[name])
            copied = tuple(zip(copies, hold.own[self.map.pages:], strict=True))
            for index, page in copied:
                self.pool.page_bytes_view(page).copy_(self.pool.page_bytes_view(lease.row_pages[index]))
        except BaseException:
            hold.release()
            raise
        if known is not None:  # the same prefix without the head's rows: this one serves more lanes
            self.evict(known)
        ready = None
        if self.pool.buffer.is_cuda:
            ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
            ready.record()
        state = KeptState(key, head, hold, self.places, shared, copied, ready)
        self.states[key] = state
        while self.bytes > self.budget and len(self.states) > 1:
            self.evict(next(iter(self.states.values())))
        if self.bytes > self.budget:  # over the budget alone
            del self.states[key]
            hold.release()
            self.counts.refused += 1
            return None
        self.counts.kept += 1
        return state

    def make_room(self, pages: int, spare: KeptState | None = None, window: int | None = None,
                  adopted: int = 0) -> bool:
        """Evict the least recently used states (never ``spare``) until ``pages`` free unpromised
        pages are there (or, given a ``window``, a lane of it adopting ``adopted`` row pages can be
        promised); whether they are."""
        def enough() -> bool:
            if window is not None:
                return self.pool.can_promise(window, adopted)
            return self.pool.available >= pages

        while not enough():
            oldest = next((state for state in self.states.values() if state is not spare), None)
            if oldest is None:
                return False
            self.evict(oldest)
        return True

    def evict(self, state: KeptState) -> None:
        """Forget ``state`` and release its pages (those a lane shares stay with the lane); one
        being written to disk keeps them until the write is done (``tfd.cache.learned``)."""
        if self.states.get(state.key) is state:
            del self.states[state.key]
            self.counts.evicted += 1
        if state.writing:
            state.dropped = True
        else:
            state.hold.release()

    def clear(self) -> int:
        """Evict every state; how many there were."""
        count = len(self.states)
        for state in list(self.states.values()):
            self.evict(state)
        return count

    def report(self) -> dict[str, object]:
        """What admin ``learn`` shows of the memory tier."""
        return {"entries": len(self.states), "bytes": self.bytes, "budget": self.budget,
                **attrs.asdict(self.counts)}

"""The prompt cache as the server sees it through the engine: its counts, its reports, eviction, and
the disk store attached once the identity is known.

Every call that touches the cache's states runs on the engine thread between steps (``Engine.ask``);
the disk's report and eviction run on a worker thread, as they may wait for a write to end. The copy
streams a store's reads back use are made at ``start``, on the trio thread, which awaits their drains
(``tfd.engine.drains``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import torch
import trio

from tfd.cache.kept import KeptCounts
from tfd.cache.learned import Learned, state_digest
from tfd.cache.prefixes import Prefixes
from tfd.cache.prompt_cache import PromptCache
from tfd.engine.drains import CopyStreams
from tfd.pool.pages import Pool
from tfd.store.copies import Device, Drain, TorchDevice
from tfd.store.store import Store, StoreCounts

CLEAR = "clear kept states"  # the mirror other ranks clear theirs by
ATTACH = "attach learned store"  # the mirror other ranks attach their own store by (``Engine.ask``)
Ask = Callable[..., Awaitable[Any]]  # Engine.ask: a question, and the name other ranks mirror a change by


class CacheFace:
    """``cache`` (None: the engine keeps no prompt states) of an engine on ``pool``, its calls made
    through ``ask``; a store attached reads states of up to ``context`` rows, into as many as
    ``lanes`` lanes at once."""

    def __init__(self, cache: PromptCache | None, pool: Pool, context: int, ask: Ask, lanes: int = 1,
                 make_device: Callable[[torch.device], Device] = TorchDevice) -> None:
        self._cache = cache
        self._pool = pool
        self._context = context
        self._ask = ask
        self._lanes = lanes
        self._make_device = make_device
        self.copies: CopyStreams | None = None  # the trio loop's copy streams and drains, from ``start``

    def start(self) -> None:
        """Make the copy streams a store's reads back will use, a lane's worth, owned by the trio loop
        this is called on for the engine's life (``tfd.engine.drains``)."""
        if self._cache is not None and self.copies is None:
            self.copies = CopyStreams(self._pool.buffer.device, self._lanes, self._make_device)

    @property
    def enabled(self) -> bool:
        return self._cache is not None

    @property
    def kept_counts(self) -> KeptCounts | None:
        return None if self._cache is None else self._cache.kept.counts

    @property
    def store_counts(self) -> StoreCounts | None:
        learned = None if self._cache is None else self._cache.learned
        return None if learned is None else learned.store.counts

    def room(self, position: int) -> tuple[int, int] | None:
        """What a state kept at ``position`` costs, and the budget; None without a cache."""
        return None if self._cache is None else \
            (self._cache.kept.state_bytes(position), self._cache.kept.budget)

    async def attach_store(self, probe: Sequence[int], at: int, open_store: Callable[[str], Store]) -> Store:
        """The disk tier: the state ``probe`` kept at ``at`` digested and forgotten, the store
        ``open_store`` opens for that digest attached (``attach_now``, on the engine thread; other
        ranks attach theirs by the mirror's name). RuntimeError when no state was kept there."""
        found: Store = await self._ask(lambda: self.attach_now(probe, at, open_store), ATTACH)
        return found

    def attach_now(self, probe: Sequence[int], at: int, open_store: Callable[[str], Store]) -> Store:
        """``attach_store``'s work, on the engine thread (this rank's own store under tensor parallel)."""
        cache = self._cache
        if cache is None:
            raise RuntimeError("no prompt cache to attach a store to")
        kept = cache.kept
        state = kept.states.get(Prefixes(probe).key_at(at))
        if state is None:
            raise RuntimeError("the identity probe's state was not kept")
        digest = state_digest(self._pool, state)
        kept.evict(state)
        store = open_store(digest)
        copies = self.copies
        cache.attach(Learned(store, self._pool, self._pool.buffer.device, self._make_device,
                             context=self._context, lanes=self._lanes,
                             streams=None if copies is None else copies.streams,
                             drains=Drain.wait_and_release if copies is None else copies))
        return store

    async def clear(self) -> int:
        """Evict every state in memory; how many there were."""
        return 0 if self._cache is None else int(await self._ask(self.clear_now, CLEAR))

    def clear_now(self) -> int:
        """``clear``'s work, on the engine thread (another rank's too, by the mirror's name)."""
        return 0 if self._cache is None else self._cache.kept.clear()

    async def report(self) -> dict[str, object]:
        """What the cache holds and did (admin ``learn``); ``{"enabled": false}`` without one."""
        cache = self._cache
        if cache is None:
            return {"enabled": False}
        found: dict[str, object] = {"enabled": True, "memory": await self._ask(cache.kept.report)}
        if cache.learned is not None:
            found["disk"] = await trio.to_thread.run_sync(cache.learned.report)
        return found

    async def evict(self) -> dict[str, int]:
        """Evict every state, in memory and on disk; how many there were of each."""
        cache = self._cache
        if cache is None:
            return {"evicted": 0}
        counts = {"evicted": await self.clear()}
        if cache.learned is not None:
            counts["evicted_disk"] = await trio.to_thread.run_sync(cache.learned.evict)
        return counts

    async def close(self) -> None:
        """Let the states offered to the disk be written, then stop its writer; then wait for the
        reads back's copies to be drained (the engine thread has stopped: no read begins)."""
        learned = None if self._cache is None else self._cache.learned
        if learned is not None:
            await trio.to_thread.run_sync(learned.close)
        if self.copies is not None:
            await self.copies.wait_idle()


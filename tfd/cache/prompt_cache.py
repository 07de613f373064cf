"""The prompt cache as the engine uses it: where an admitted lane starts, and the states it keeps.

``PromptCache`` joins the memory tier (``tfd.cache.kept``) and, once attached, the disk's
(``tfd.cache.learned``). ``choose`` picks, at admission, the longest state a prompt extends: the
memory's (the states in the way of the lane's window evicted), or the disk's when it holds a longer
one. ``start`` puts a lane just opened there: a memory state's rows adopted and pieces copied; a
learned state's read into the lane's own pages begun off the engine thread, and once it has ended
(``restored``) kept in memory too. A learned state the store refuses (damaged, missing), or whose
copies fail (every one queued drained first), leaves the lane at the beginning, its pieces
initialised again: its request answers as a fresh one would. ``keep``
runs after a step for each lane whose prompt chunk ended at a keep point, and offers the state kept
to the disk. Nothing here knows a lane: a prompt is its ``Prefixes``, a lane's device side its
lease and memory. Engine thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import attrs
import torch

from tfd.cache.kept import KeptState, KeptStates
from tfd.cache.learned import Learned, Restoring
from tfd.cache.prefixes import Prefixes
from tfd.model.memory import LaneMemory
from tfd.pool.pages import Lease
from tfd.store.image import Image
from tfd.store.store import Refused

log = logging.getLogger("tfd.learn")
InitState = Callable[[Mapping[str, torch.Tensor]], None]  # a lane's state pieces made fresh


@attrs.frozen
class Start:
    """Where an admitted lane starts: a kept state in memory, a learned image on disk, or (neither)
    the beginning."""

    state: KeptState | None = None
    image: Image | None = None

    @property
    def adopted(self) -> int:
        """The row pages a lane starting here adopts rather than takes."""
        return 0 if self.state is None else len(self.state.shared)


class PromptCache:
    """``kept``: the states in memory; ``init_state``: a lane's pieces made fresh, after a learned
    state read back was refused over them; ``learned``: the disk's, attached once the identity is
    known (``attach``)."""

    def __init__(self, kept: KeptStates, init_state: InitState) -> None:
        self.kept = kept
        self.init_state = init_state
        self.learned: Learned | None = None
        self.on_restored: Callable[[], None] = lambda: None  # a learned state's read ended (any thread)
        # tensor parallel: values at their least over the ranks (``Lockstep.least``); None: one rank
        self.least: Callable[[Sequence[int]], list[int]] | None = None

    def attach(self, learned: Learned) -> None:
        """Keep states on disk too from now on, and resume lanes from them."""
        self.learned = learned

    def choose(self, prompt: Prefixes, window: int, drafts: bool) -> Start:
        """Where a lane of ``prompt`` and ``window`` rows starts (``drafts``: it needs the MTP
        head's rows): the longest state kept in memory or learned on disk."""
        state = self.kept.admission(prompt, window, drafts)
        if self.learned is None:
            return Start(state)
        image = self.learned.find(prompt, drafts, 0 if state is None else state.position)
        return Start(None, image) if image is not None else Start(state)

    def start(self, begin: Start, lease: Lease, memory: LaneMemory) -> int | Restoring:
        """Put a lane just opened (``lease``: its pieces taken, no row page yet; ``memory``: their
        views) at ``begin``: the position it goes on from (0: the beginning, a miss), or, for a
        learned state, its read back begun (``Learned.begin_restore``: the lane waits for it, then
        ``restored``); ``on_restored`` is called when such a read ends."""
        counts = self.kept.counts
        if begin.state is not None:
            return self.kept.resume(lease, memory, begin.state)
        image = begin.image
        if image is None or self.learned is None:
            counts.misses += 1
            return 0
        lease.take(image.position)
        return self.learned.begin_restore(image, lease.row_pages, memory.pieces, self.on_restored)

    def joined(self, restoring: Restoring) -> None:
        """The compute stream's next work sees what a read back that has ended wrote into its lane
        (``Learned.joined``): before the lane runs, its pieces are made again, or its pages go back."""
        if self.learned is not None:
            self.learned.joined(restoring)

    def restored(self, restoring: Restoring, prompt: Prefixes, lease: Lease, memory: LaneMemory,
                 drafts: bool, refused_elsewhere: bool = False) -> int:
        """The position a lane goes on from once its learned state's read has ended: the state's, kept
        in memory too; 0 (a miss, its pieces initialised again) when the store refused its files
        (counted and forgotten there), a copy failed (its files may be sound: kept), or, under tensor
        parallel, another rank's read of the state failed (``refused_elsewhere``)."""
        counts = self.kept.counts
        error = restoring.error()
        if error is not None or refused_elsewhere:  # another rank's read failed: its share is not there
            if error is not None and not isinstance(error, Refused):
                log.warning("reading learned state %s back failed; the lane starts from the beginning",
                            restoring.image.key, exc_info=error)
            self.init_state(memory.pieces)
            counts.misses += 1
            return 0
        position = restoring.image.position
        counts.hits += 1
        counts.resumed_tokens += position
        self.kept.keep(prompt, lease, memory, position, drafts)
        return position

    def passed(self, keep_points: tuple[int, ...], position: int) -> tuple[int, ...]:
        """The keep points a lane resumed at ``position`` still keeps at: those closer than the
        cache's gain past it are passed over (a state is kept only where a step ends, and cutting a
        turn's few new rows into two steps costs more launches than the next turn's first step
        prefilling them again). A lane at the beginning keeps them all."""
        if position == 0:
            return keep_points
        return tuple(p for p in keep_points if p >= position + self.kept.gain)

    def keep(self, prompt: Prefixes, lease: Lease, memory: LaneMemory, position: int, head: bool) -> None:
        """Keep a lane's state now that its prefill reached ``position``, one of its keep points
        (``head``: its MTP head's rows are written), and offer a new one to the disk."""
        state = self.kept.keep(prompt, lease, memory, position, head)
        if state is not None and self.learned is not None:
            self.learned.offer(state, prompt)

    def settle(self) -> None:
        """Before a step: the disk's writes done since are unpinned (``Learned.settle``; under tensor
        parallel, those done on every rank: ``least``)."""
        if self.learned is not None:
            self.learned.settle(self.least)

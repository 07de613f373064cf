"""Lanes in and out of the pool: admission, a lane's pieces and where it starts, its pages back.

``admit`` promises a waiting lane its window when the pool can (after the prompt cache has evicted
kept states in the way, and found where the lane starts), ``open`` gives it its state pieces,
initialised, resumes it there (or begins reading its state back from disk: ``settle`` resumes it once
the read has ended) and notes where decode steps and verify rounds find its pieces; ``close`` gives its
pages back (a lane whose state is being read, once the read has ended). Engine thread only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from tfd.cache.learned import Restoring
from tfd.cache.prompt_cache import PromptCache, Start
from tfd.engine.lane import Lane
from tfd.engine.scheduler import Admission
from tfd.families.hybrid import HybridModel
from tfd.model.decode import DecodeMemory
from tfd.model.decode_batch import Columns
from tfd.model.memory import LaneMemory
from tfd.model.verify import VerifyLanes
from tfd.pool.pages import Pool

log = logging.getLogger("tfd.engine")


class Opener:
    """Lanes of ``model`` on ``pool``; ``cache``: the prompt cache (None: none); ``memory`` and
    ``columns``: the batched decode step's (None: the model decodes lane by lane)."""

    def __init__(self, model: HybridModel, pool: Pool, cache: PromptCache | None, memory: DecodeMemory | None,
                 columns: Columns) -> None:
        self.model = model
        self.pool = pool
        self.cache = cache
        self.memory = memory
        self.columns = columns
        self.gdn_names = model.gdn_layers().layers
        self.restoring: list[Lane] = []  # lanes whose state is being read back, in admission order
        self.closed: list[Lane] = []  # those of them ended meanwhile: pages back once the read ends
        # tensor parallel: values at their least over the ranks (``Lockstep.least``); None: one rank
        self.least: Callable[[Sequence[int]], list[int]] | None = None

    def admit(self, lane: Lane, drafts: bool) -> Admission:
        """Admit a waiting lane if the pool can promise its window, resuming it from the longest
        kept state its prompt extends; ``drafts``: it verifies drafts in rounds. WAIT while the pool
        is short; DROPPED when opening it failed (logged; its pages are back)."""
        begin = Start()
        if self.cache is None or not lane.request.cache:  # its prompt chunked as without a cache
            lane.keeps_nothing()
        else:
            begin = self.cache.choose(lane.prefixes, lane.request.window, drafts)
        if not self.pool.can_promise(lane.request.window, begin.adopted):
            return Admission.WAIT
        lane.promised(self.pool.promise(lane.request.window, begin.adopted))
        try:
            self.open(lane, drafts, begin)
        except Exception:
            log.exception("could not open a lane for request %s", lane.request.id)
            return Admission.DROPPED
        return Admission.ADMITTED

    def open(self, lane: Lane, drafts: bool, begin: Start | None = None) -> None:
        """Give an admitted lane (its lease promised) its state pieces, initialised, and start it
        where ``begin`` says (``PromptCache.start``); ``drafts``: it verifies drafts in rounds.

        Error handling: on failure the lease is finished, so the pool is as before.
        """
        lease = lane.lease
        assert lease is not None
        try:
            pieces = lease.open(self.model.nonzero_state)
            memory = LaneMemory(pieces, lease.page_table, lease.host_table)
            offsets = [] if self.memory is None else \
                self.memory.lane_offsets(pieces, self.gdn_names, self.columns.ple)
            verify = VerifyLanes.lane_offsets(pieces, self.gdn_names, self.pool.buffer) if drafts else []
            lane.opened(memory, drafts, offsets, verify)
            if self.cache is not None and lane.request.cache:  # a bypass is neither a hit nor a miss
                at = self.cache.start(begin or Start(), lease, memory)
                if isinstance(at, Restoring):  # it waits for its state, off this thread (``settle``)
                    lane.reads_back(at)
                    self.restoring.append(lane)
                else:
                    lane.resumed(at, self.cache.passed(lane.keep_points, at))
        except BaseException:
            lease.finish()
            lane.open_failed()
            raise

    def settle(self) -> tuple[list[Lane], list[Lane]]:
        """The lanes whose state's read back has ended: (those that go on now, from where it left
        them; those whose going on failed, logged, their pages back). A lane closed while its state
        was read gives its pages back now, no sooner: the read wrote into them."""
        started: list[Lane] = []
        failed: list[Lane] = []
        for lane, refused_elsewhere in self._ended_reads():
            self.restoring.remove(lane)
            restoring, lease, memory = lane.restoring, lane.lease, lane.memory
            assert restoring is not None and lease is not None and memory is not None
            assert self.cache is not None
            self.cache.joined(restoring)  # on the device, not the host: the step after waits for its copies
            if lane in self.closed:
                self.closed.remove(lane)
                lane.read_ended()
                self.close(lane)
                continue
            try:
                at = self.cache.restored(restoring, lane.prefixes, lease, memory, lane.drafting,
                                         refused_elsewhere)
            except Exception:
                log.exception("could not resume request %s from its learned state", lane.request.id)
                lane.read_ended()
                self.close(lane)
                lane.open_failed()
                failed.append(lane)
                continue
            lane.resumed(at, self.cache.passed(lane.keep_points, at))
            now = time.monotonic()
            lane.joined_after_read(now)
            started.append(lane)
            # where a resumed turn's first token waits: before its read, the read, after it
            ended, arrived = restoring.ended or restoring.began, lane.request.arrived or restoring.began
            log.info("request %s resumed %d tokens read back: asked for %.3f s after it arrived (queued for "
                     "the engine at %.3f s, taken at %.3f s), read in %.3f s, in the step %.3f s after",
                     lane.request.id, at, restoring.began - arrived, lane.posted - arrived,
                     lane.taken - arrived, ended - restoring.began, now - ended)
        return started, failed

    def _ended_reads(self) -> list[tuple[Lane, bool]]:
        """The restoring lanes whose read has ended (on every rank, under tensor parallel), each with
        whether another rank's read of its state failed (this rank's then recomputes it too)."""
        ended = [lane.restoring is None or lane.restoring.done() for lane in self.restoring]
        if self.least is None:
            return [(lane, False) for lane, done in zip(self.restoring, ended, strict=True) if done]
        failed = [done and lane.restoring is not None and lane.restoring.error() is not None
                  for lane, done in zip(self.restoring, ended, strict=True)]
        count = len(ended)
        agreed = self.least([int(done) for done in ended] + [-int(bad) for bad in failed])  # -least: most
        return [(lane, agreed[count + i] < 0) for i, lane in enumerate(self.restoring) if agreed[i]]

    def close(self, lane: Lane) -> None:
        """Give the lane's pages back (again: nothing); a lane whose state is being read back gives
        them at ``settle``, once the read has ended."""
        if lane.restoring is not None and lane in self.restoring:
            if lane not in self.closed:
                self.closed.append(lane)
            return
        if lane.lease is not None:
            lane.lease.finish()
        lane.released()

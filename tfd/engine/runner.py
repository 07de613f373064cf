"""The runner: a step's rows on the device, by the part that runs each.

Lanes come and go through the ``Opener`` (admission, pieces, where a lane starts, its pages back).
A step's rows: drafting lanes' windows as verify rounds (``tfd.engine.rounds``); plain decode rows
as batched steps launched one ahead (``tfd.engine.decode_pipeline``); everything else (prompt
chunks, decode rows drawn with cuts or logprobs, decode rows of a model that does not batch them)
as one pass (``tfd.engine.prefill_pass``). Row pages are taken as rows grow; after the step, lanes
whose prompt chunk ended at a keep point keep their state in the prompt cache. Host-to-device
copies go from pinned memory without waiting; one host sync a step: the drawn tokens.
Engine thread only.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from tfd.cache.kept import KeptStates
from tfd.cache.prompt_cache import PromptCache
from tfd.engine.decode_pipeline import DecodePipeline
from tfd.engine.drawn import Drawn
from tfd.engine.lane import Lane
from tfd.engine.opening import Opener
from tfd.engine.prefill_pass import PrefillPass
from tfd.engine.rounds import Propose, Rounds, drafts_from_head
from tfd.engine.scheduler import Admission, Work
from tfd.families.hybrid import HybridModel
from tfd.model.decode import DecodeMemory
from tfd.model.decode_batch import Columns
from tfd.model.memory import PageRows
from tfd.pool.pages import Pool


@attrs.frozen
class Drafting:
    """Drafts from the MTP head: ``most`` a round, later ones while the one before is at least
    ``confidence`` likely; a lane drafts only when it is admitted with at most ``max_lanes`` lanes
    running or waiting (0: always)."""

    most: int
    confidence: float
    max_lanes: int = 0


class Runner:
    """``context``: the most rows a lane may hold (the width of a decode step's page tables).
    ``graphs``: replay captured CUDA graphs for decode steps (CUDA only; captured here, at load).
    ``drafting``: lanes that ask for it verify drafts from the MTP head in rounds (a model with a
    head and one residual stream; the pool's layout with the head's rows and verify's buffers for
    windows of ``drafting.most + 1`` rows); ``propose`` replaces the head (a scripted one in tests).
    ``kept_bytes``: the prompt cache's budget in memory (``tfd.cache``; 0: no cache), ``keep_gain`` the
    tokens a resumed lane prefills before it keeps a state again."""

    def __init__(self, model: HybridModel, pool: Pool, context: int, max_lanes: int,
                 graphs: bool = False, drafting: Drafting | None = None,
                 propose: Propose | None = None, kept_bytes: int = 0, keep_gain: int = 0) -> None:
        self.pool = pool
        rows = PageRows(pool)
        columns = Columns(len(model.gdn_layers().layers), pool.layout.row_pages(context),
                          ple=model.ple_state() is not None)
        memory = DecodeMemory(pool, model.dtype, max_lanes) if model.batches_decode else None
        self.pipeline = None if memory is None else \
            DecodePipeline(model, memory, columns, pool.null_page, max_lanes, graphs)
        self.graphs = None if self.pipeline is None else self.pipeline.graphs
        self.rounds: Rounds | None = None
        self.drafting = drafting
        if drafting is not None and drafts_from_head(model) and memory is not None:
            self.rounds = Rounds(model, memory, rows, columns, drafting.most, drafting.confidence, propose,
                                 graphs, max_lanes)
        self.cache = PromptCache(KeptStates(pool, model.pieces(), kept_bytes, keep_gain), model.init_state) \
            if kept_bytes else None  # its disk tier attached once the identity is known
        self.opener = Opener(model, pool, self.cache, memory, columns)
        self.prefill = PrefillPass(model, rows, self.pipeline, self.rounds)
        self.filling = False  # ``drew`` began the masks of the step run ahead

    def admit(self, lane: Lane, load: int = 1) -> Admission:
        """Admit a waiting lane if the pool can promise its window (``Opener.admit``); ``load``: the
        lanes running or waiting, which decides whether it drafts."""
        drafts = self.rounds is not None and lane.request.draft and self._drafts_at(load)
        return self.opener.admit(lane, drafts)

    def _drafts_at(self, load: int) -> bool:
        """Whether a lane admitted at ``load`` lanes drafts."""
        assert self.drafting is not None
        return not self.drafting.max_lanes or load <= self.drafting.max_lanes

    def close(self, lane: Lane) -> None:
        """Give the lane's pages back (again: nothing); one whose state is being read back, once the
        read has ended (``Opener.close``)."""
        self.opener.close(lane)

    def settle_restores(self) -> tuple[list[Lane], list[Lane]]:
        """Lanes whose state's read back has ended: those that go on now, those that failed
        (``Opener.settle``)."""
        return self.opener.settle()

    @property
    def restoring(self) -> bool:
        """Whether a lane's state is being read back (its pages held until the read ends)."""
        return bool(self.opener.restoring)

    @torch.no_grad()
    def run(self, works: Sequence[Work]) -> list[Drawn]:
        """Run every work's rows and draw a token for each work that samples (a verify round: its
        kept draws). Rows the step run ahead already ran are not run again; a plain decode step
        launches the next one before it waits."""
        if self.cache is not None:
            self.cache.settle()
        with self.pool.tables_together():  # the lanes' new page ids in one copy, not one a lane
            for work in works:
                lease = work.lane.lease
                assert lease is not None and work.lane.memory is not None
                lease.take(work.start + work.length)
                if self.rounds is not None and work.lane.drafting:
                    # its next round (run ahead) and its head's chained cells go past its rows: on its pages
                    lease.take(min(lease.window, work.start + work.length + 2 * self.rounds.most + 1))
        verified = []
        rounds = [work for work in works if work.verify]
        if rounds:  # drafting lanes' windows: a verify pass of their own
            assert self.rounds is not None
            verified = [Drawn(work, found.tokens, found.logprobs, found.drafts)
                        for work, found in zip(rounds, self.rounds.run(rounds), strict=True)]
        return verified + self._run_rest([work for work in works if not work.verify])

    def drew(self, drawn: Sequence[Drawn]) -> None:
        """The last step's tokens are on the host, not yet taken: start the masks the step run ahead
        needs (its grammar lanes', each lane's token judged by its grammar first) while the lanes
        take them (``DecodePipeline.fill_ahead``)."""
        if self.pipeline is not None:
            self.filling = self.pipeline.fill_ahead(drawn)

    def took(self) -> None:
        """The lanes took the last step's tokens: start what the step run ahead needs from the host
        and can start now (its grammar lanes' masks, unless ``drew`` began them), while the host
        goes on."""
        if self.pipeline is not None and not self.filling:
            self.pipeline.fill_ahead()
        self.filling = False

    def _run_rest(self, works: Sequence[Work]) -> list[Drawn]:
        """``works`` without verify rounds: the rows the step run ahead ran read from it, plain
        decode rows launched (and the step after them), the rest as a prefill pass."""
        pipeline = self.pipeline
        ahead = None if pipeline is None else pipeline.ahead
        ran = ahead.ran(works) if ahead is not None else [False] * len(works)
        covered = [work for work, done in zip(works, ran, strict=True) if done]
        rest = [work for work, done in zip(works, ran, strict=True) if not done]
        if pipeline is not None:
            pipeline.ahead = None
            if ahead is not None and not rest:  # the whole step ran ahead: launch the next, then wait
                ahead = pipeline.go_on(ahead, covered, further=pipeline.ahead_able(covered))
                return _drawn(covered, ahead.tokens(), ahead.lanes)
            if ahead is not None and covered and ahead.on_host:  # its draws now: its lanes took the last
                ahead = pipeline.drawn_on_host(ahead, covered)
            if not covered and works and pipeline.ahead_able(works):
                step = pipeline.launch(works)
                return _drawn(works, step.tokens(), step.lanes)
        drawn = self.prefill.run(rest)
        self._keep(rest)
        if ahead is None or not covered:
            return drawn
        return _drawn(covered, ahead.tokens(), ahead.lanes) + drawn

    def _keep(self, works: Sequence[Work]) -> None:
        """Keep the state of each lane whose prompt chunk just ended at one of its keep points."""
        if self.cache is None:
            return
        for work in works:
            lane, end = work.lane, work.start + work.length
            if not work.decode and end in lane.keep_points:
                assert lane.lease is not None and lane.memory is not None
                self.cache.keep(lane.prefixes, lane.lease, lane.memory, end, lane.drafting)


def _drawn(works: Sequence[Work], tokens: Sequence[int], lanes: Sequence[Lane]) -> list[Drawn]:
    """``works``' tokens from the decode step that ran their rows for ``lanes`` (in its column order)."""
    where = {id(lane): i for i, lane in enumerate(lanes)}
    return [Drawn(work, (tokens[where[id(work.lane)]],), None) for work in works]

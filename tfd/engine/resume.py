"""Where an admitted lane starts: at the beginning, at a kept state in memory, or at a learned one.

``choose`` picks, at admission, the longest state the lane's prompt extends: the prompt cache's
(``tfd.engine.kept``, the states in the way of the lane's window evicted), or the disk store's when
it holds a longer one (``tfd.store.learned``). ``start`` puts the lane there once it is opened: a
memory state's rows adopted and pieces copied, a learned state read into the lane's own pages and
then kept in memory too; a learned state the store refuses (damaged, missing) leaves the lane at the
beginning, recomputed; a lane resumed passes over its keep points within the cache's ``gain`` of
where it resumed (TF_PROMPT_KEEP_GAIN). ``keep`` runs after a step: each lane whose prompt chunk
ended at a keep point keeps its state, and offers it to the disk store. Engine thread only.
"""

from __future__ import annotations

from collections.abc import Sequence

from tfd.engine.kept import KeptState, KeptStates
from tfd.engine.lane import Lane
from tfd.engine.scheduler import Work
from tfd.families.hybrid import HybridModel
from tfd.store.learned import Learned
from tfd.store.store import Image, Refused


def choose(kept: KeptStates | None, learned: Learned | None, lane: Lane, drafts: bool
           ) -> tuple[KeptState | None, Image | None]:
    """The kept state or the learned image ``lane`` resumes from (at most one), or neither; a lane
    of a runner without a prompt cache, or whose request bypasses it, keeps nothing (its keep points
    are cleared: its prompt is chunked as on a server without a cache)."""
    if kept is None or not lane.request.cache:
        lane.keep_points = ()
        return None, None
    state = kept.admission(lane, drafts)
    if learned is None:
        return state, None
    image = learned.find(lane, drafts, 0 if state is None else state.position)
    return (None, image) if image is not None else (state, None)


def start(model: HybridModel, kept: KeptStates | None, learned: Learned | None, lane: Lane,
          state: KeptState | None, image: Image | None, drafts: bool) -> None:
    """Put a lane just opened (pieces initialised, no row page yet) at ``state`` or ``image``."""
    if kept is None or not lane.request.cache:  # a bypass is neither a hit nor a miss
        return
    if state is not None:
        kept.resume(lane, state)
        _pass_near(kept, lane)
        return
    if image is None or learned is None:
        kept.counts.misses += 1
        return
    assert lane.lease is not None and lane.memory is not None
    lane.lease.take(image.position)
    try:
        learned.restore(lane, image)
    except Refused:  # counted and forgotten by the store: recomputed from the start
        model.init_state(lane.memory.pieces)
        kept.counts.misses += 1
        return
    lane.position = lane.cached = image.position
    kept.counts.hits += 1
    kept.counts.resumed_tokens += image.position
    kept.keep(lane, image.position, drafts)
    _pass_near(kept, lane)


def _pass_near(kept: KeptStates, lane: Lane) -> None:
    """A lane just resumed passes over its keep points closer than ``kept.gain`` past its position:
    a state is kept only where a step ends, and cutting the turn's few new rows into two steps costs
    more launches than the next turn's first step prefilling them again."""
    lane.keep_points = tuple(p for p in lane.keep_points if p >= lane.position + kept.gain)


def keep(kept: KeptStates | None, learned: Learned | None, works: Sequence[Work]) -> None:
    """Keep the state of each lane whose prompt chunk just ended at one of its keep points, and
    offer the new ones to the disk store."""
    if kept is None:
        return
    for work in works:
        end = work.start + work.length
        if not work.decode and end in work.lane.keep_points:
            state = kept.keep(work.lane, end, work.lane.drafting)
            if state is not None and learned is not None:
                learned.offer(state, work.lane)

"""What a step drew for each work, and the lanes moved past the rows it ran (``settle``)."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from tfd.engine.request import TokenLogprob
from tfd.engine.scheduler import Work


@attrs.frozen
class Drawn:
    """A work's drawn tokens (one; a verify round's kept draws, one a row it kept) and, when asked,
    their log-probabilities; a drafting lane's next drafts."""

    work: Work
    tokens: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None
    drafts: tuple[int, ...] = ()


def settle(works: Sequence[Work], drawn: Sequence[Drawn]) -> None:
    """After a step: each work's lane past the rows it ran (a verify round past those it kept), a
    drafting lane's next drafts and its draft counts."""
    for work in works:
        work.lane.advanced(work.start + work.length)
    for item in drawn:
        lane = item.work.lane
        if item.work.verify:
            lane.verified(item.work.start, item.work.length, len(item.tokens), item.drafts)
        elif lane.drafting:
            lane.drafted(item.drafts)

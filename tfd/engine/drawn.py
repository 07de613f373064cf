"""What a step drew for each work, the lanes moved past the rows it ran (``settle``), and the draw on
the host's path of lanes' next tokens (``host_draw``)."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from tfd.engine import grammar_masks
from tfd.engine.lane import Lane
from tfd.engine.request import TokenLogprob
from tfd.engine.sampling import Rows, sample
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


def host_draw(lanes: Sequence[Lane], logits: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Each lane's next token from its row of ``logits`` [lanes, vocab]: its sampling at that token
    (a bar while ``min_tokens`` holds), its history for penalties, its grammar's mask (filled on the
    host while the device works), the keyed draw (``sampling.sample``)."""
    follows = [(lane.grammar, row, ()) for row, lane in enumerate(lanes) if lane.grammar is not None]
    rows = Rows.of([lane.sampling_at(len(lane.generated)) for lane in lanes], [lane.seed for lane in lanes],
                   [lane.next_position for lane in lanes], device, [lane.history() for lane in lanes],
                   grammar_masks.allowed(len(lanes), follows) if follows else None)
    return sample(logits, rows)

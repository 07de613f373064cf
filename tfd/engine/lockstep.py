"""Engines in lockstep: under tensor parallelism every rank runs the same steps on its share of the
model, and only rank 0 hears clients.

Rank 0's engine reads its inbox once a step (requests submitted, cancels, the daemon's own changes to
the prompt cache, stop) and shares what it read with the other ranks before it steps
(``Leader.agree``); each other rank's engine takes the same messages (``Follower.agree``) and steps
on them. Every decision a step takes (admission, chunking, keeping and resuming prompt states, the
draws: logits summed over the ranks are the same bits on each) follows from those messages and the
state they all hold alike, so the ranks stay in step without a word more; their collectives meet.
Nothing a client sees comes from the other ranks: they deliver no event.

What each rank does apart (reading a learned state back, writing one out: threads of its own, on its
files) ends at different moments on each; the steps take such an ending only once every rank has it
(``least``: the reads back ended and failed, the writes done, at their least over the ranks), so a
lane resumes, or recomputes after any rank's read failed, at the same step everywhere, and pages come
free at the same step.

What crosses is plain data (``Shared``): a request without its compiled grammar (a rank compiles the
grammar's text against its own vocabulary: ``Grammar`` objects hold native matchers), a cancel, a
named change to the prompt cache (``Mirrored``), the stop. Rank 0 shares at least once a second (an
idle engine still beats), so the other ranks never wait long in a broadcast.

Error handling: a broadcast that fails (a rank gone) raises in the engine thread, which stops the
engine (``Engine._main``): the daemon then drains and exits, and the other ranks' broadcasts fail
with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import torch
import torch.distributed as dist

from tfd.engine.grammar import Grammar
from tfd.engine.request import Request


@attrs.frozen
class Submitted:
    request: Request  # its grammar None: ``grammar`` holds the text
    grammar: str | None = None
    lanes: int = 1  # the lanes its grammar was compiled for


@attrs.frozen
class Cancelled:
    request_id: str


@attrs.frozen
class Mirrored:
    """A change to the engine's state rank 0 made between steps (``Engine.ask``'s ``mirror``), by name."""

    name: str


@attrs.frozen
class Stopped:
    pass


Shared = Submitted | Cancelled | Mirrored | Stopped


def least(values: Sequence[int], group: dist.ProcessGroup | None) -> list[int]:
    """Each of ``values`` at its least over the ranks (every rank passes as many, in the same order)."""
    found = torch.tensor(list(values), dtype=torch.int64)
    if found.numel():
        dist.all_reduce(found, op=dist.ReduceOp.MIN, group=group)
    return [int(value) for value in found.tolist()]


class _Rank:
    """A rank's side of the lockstep over ``group`` (a gloo group: plain objects on the host)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group

    def least(self, values: Sequence[int]) -> list[int]:
        """``values`` at their least over the ranks (what every rank has done: reads back ended, writes)."""
        return least(values, self.group)


class Leader(_Rank):
    """Rank 0: shares each step's messages."""

    def agree(self, shared: Sequence[Shared]) -> list[Shared]:
        box: list[object] = [list(shared)]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return list(shared)


class Follower(_Rank):
    """Another rank: each step's messages, as rank 0 shared them; ``compile`` makes a grammar of a
    request's text (its vocabulary's)."""

    def __init__(self, compile: Callable[[str, int], Grammar], group: dist.ProcessGroup | None = None
                 ) -> None:
        super().__init__(group)
        self.compile = compile

    def agree(self, shared: Sequence[Shared]) -> list[Shared]:
        box: list[object] = [None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        found = box[0]
        assert isinstance(found, list)
        return [self._compiled(item) for item in found]

    def _compiled(self, item: Shared) -> Shared:
        """A request with its grammar compiled here from the text rank 0 sent; anything else as it came."""
        if not isinstance(item, Submitted) or item.grammar is None:
            return item
        return attrs.evolve(item, request=attrs.evolve(item.request, grammar=self.compile(item.grammar,
                                                                                           item.lanes)))


Lockstep = Leader | Follower

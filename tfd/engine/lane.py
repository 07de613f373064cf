"""A lane: one request's sequence as the engine runs it, from admission to its last token.

Its fields change only through its methods, each a transition the engine makes: promised pages,
opened (pieces, drafting), resumed at a kept state, advanced past rows run, a token taken, a verify
round's counts, cancelled, retired. ``take`` holds the finish rule: a stop token, a stop string,
``max_tokens`` reached (a stop token only after ``min_tokens``: it is barred from the draw until
then); ``emits`` is the same rule over a round's draws before the text is read.
The scheduler reads its phase and positions; the runner owns its lease and memory views. Owned by
the engine thread alone.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

from tfd.cache.prefixes import Prefixes, keep_points
from tfd.engine.drafts import DraftCounts
from tfd.engine.request import FinishReason, Request, Sampling, prompt_seed
from tfd.engine.sampling import History, barring, drawn_by_step, penalized

if TYPE_CHECKING:
    from tfd.cache.learned import Restoring
    from tfd.engine.detokenize import Detokenizer
    from tfd.engine.grammar import Matcher
    from tfd.model.memory import LaneMemory
    from tfd.pool.pages import Lease


class Phase(enum.Enum):
    WAITING = "waiting"  # queued: no pages yet
    RESTORE = "restoring"  # admitted: its state is being read back from disk; it runs no rows yet
    PREFILL = "prefill"  # admitted: its prompt is going through in chunks
    DECODE = "decode"  # one row a step
    DONE = "done"


def _seed(lane: Lane) -> int:
    seed = lane.request.sampling.seed
    return seed if seed is not None else prompt_seed(lane.request.prompt)


def _keep_points(lane: Lane) -> tuple[int, ...]:
    return keep_points(len(lane.request.prompt), lane.request.keep_at)


def _prefixes(lane: Lane) -> Prefixes:
    return Prefixes(lane.request.prompt)


def _matcher(lane: Lane) -> Matcher | None:
    grammar = lane.request.grammar
    return None if grammar is None else grammar.matcher()


@attrs.define(eq=False)
class Lane:
    """``number``: the engine's count at submission; ``detokenizer``: the reply's text and stop
    strings (None: tokens only, as the bench runs them)."""

    number: int
    request: Request
    detokenizer: Detokenizer | None = None
    phase: Phase = Phase.WAITING
    position: int = 0  # rows of the sequence already computed into the lane's state
    generated: list[int] = attrs.Factory(list)
    seed: int = attrs.Factory(_seed, takes_self=True)
    cancelled: bool = False
    lease: Lease | None = None
    memory: LaneMemory | None = None
    first_token_at: float | None = None
    drafting: bool = False  # its decode steps are verify rounds (the runner decides at open)
    drafts: list[int] = attrs.Factory(list)  # the drafts its next round verifies after its pending token
    counts: DraftCounts = attrs.Factory(DraftCounts)
    keep_points: tuple[int, ...] = attrs.Factory(_keep_points, takes_self=True)  # prefill chunks end there
    cached: int = 0  # prompt tokens resumed from a kept state
    restoring: Restoring | None = None  # its learned state's read back, until it has ended
    offsets: tuple[int, ...] = ()  # its pieces' offset fields in a batched decode step's columns
    verify_offsets: tuple[int, ...] = ()  # a drafting lane's verify buffers' offset fields
    drawn: dict[int, int] = attrs.Factory(dict)  # token: times drawn (what penalties read)
    _prompt_set: frozenset[int] | None = None  # its prompt's distinct tokens, once a penalty asks
    prefixes: Prefixes = attrs.Factory(_prefixes, takes_self=True)  # the prompt as the cache names it
    leader: Lane | None = None  # the lane of ``request.after``, while it is the engine's
    grammar: Matcher | None = attrs.Factory(_matcher, takes_self=True)  # its place in its grammar
    taken: float = attrs.Factory(time.monotonic)  # when the engine thread took it in (monotonic)
    posted: float = attrs.Factory(time.monotonic)  # when the trio side queued it for the engine
    joined_at: float | None = None  # when it went on after its state's read back, until its first token

    # -- what the lane is --------------------------------------------------------------------------

    @property
    def prompt_length(self) -> int:
        return len(self.request.prompt)

    @property
    def next_position(self) -> int:
        """Where the token drawn next goes in the sequence."""
        return self.prompt_length + len(self.generated)

    @property
    def tokens_left(self) -> int:
        """Tokens it may still draw before ``max_tokens``."""
        return self.request.max_tokens - len(self.generated)

    @property
    def behind_leader(self) -> bool:
        """Whether it waits for its leader's prompt to go through first (to resume from its state)."""
        leader = self.leader
        return leader is not None and not leader.cancelled and leader.phase in (Phase.WAITING, Phase.PREFILL)

    def stops_at(self, token: int) -> bool:
        """Whether ``token`` is one of the request's stop tokens (it is kept, and ends the reply)."""
        return token in self.request.stop_ids

    def stopped_by(self, token: int, after: int = 0) -> bool:
        """Whether taking ``token`` ends the reply on a stop token (past ``min_tokens``), taken next
        or ``after`` tokens later (a verify round's later draws)."""
        return self.stops_at(token) and len(self.generated) + after >= self.request.min_tokens

    def sampling_at(self, index: int) -> Sampling:
        """How its token of index ``index`` (0: the first it draws) is drawn: its request's sampling,
        the stop tokens barred while fewer than ``min_tokens`` are drawn before it."""
        if index < self.request.min_tokens and self.request.stop_ids:
            return barring(self.request.sampling, self.request.stop_ids)
        return self.request.sampling

    def history(self, ahead: Sequence[int] = ()) -> History | None:
        """What the penalties of its next draw read (with ``ahead``: the draw after those tokens, a
        verify row's after the drafts before it); None when its request has no penalty."""
        if not penalized(self.request.sampling):
            return None
        if self._prompt_set is None:
            self._prompt_set = frozenset(self.request.prompt)
        drawn = self.drawn
        if ahead:
            drawn = dict(drawn)
            for token in ahead:
                drawn[token] = drawn.get(token, 0) + 1
        return History(drawn, self._prompt_set)

    @property
    def keyed_plainly(self) -> bool:
        """Whether its draw is a decode step's keyed draw, under its grammar's mask if it has one
        (``sampling.drawn_by_step``, no stop token barred at any of its tokens: the step's draw
        knows no lane's count)."""
        barred = self.request.min_tokens and self.request.stop_ids
        return drawn_by_step(self.request.sampling) and not barred

    @property
    def drawn_by_step(self) -> bool:
        """Whether a decode step's own keyed draw is its draw: ``keyed_plainly``, no grammar."""
        return self.keyed_plainly and self.grammar is None

    @property
    def draws_alone(self) -> bool:
        """``drawn_by_step`` and no logprobs asked: the graphs' own draw serves it, with nothing for
        the host to add."""
        return self.drawn_by_step and self.request.sampling.logprobs is None

    def emits(self, tokens: Sequence[int]) -> tuple[tuple[int, ...], bool]:
        """Of ``tokens`` drawn in a row (a verify round's kept draws), those the lane takes (up to
        and with a stop token, at most ``tokens_left``), and whether they end it. Stop strings are
        ``take``'s: they need the text."""
        left = self.tokens_left
        for at, token in enumerate(tokens[:left]):
            if self.stopped_by(token, at):
                return tuple(tokens[:at + 1]), True
        return tuple(tokens[:left]), len(tokens) >= left

    # -- transitions ------------------------------------------------------------------------------

    def admitted(self) -> None:
        """Admitted: its prompt goes through in chunks from now on, or once its state is read back."""
        self.phase = Phase.RESTORE if self.restoring is not None else Phase.PREFILL

    def retire(self) -> None:
        """It runs no more (finished, cancelled, dropped)."""
        self.phase = Phase.DONE

    def cancel(self) -> None:
        """It leaves at the next step boundary."""
        self.cancelled = True

    def promised(self, lease: Lease) -> None:
        """Its window's pages are promised to it."""
        self.lease = lease

    def opened(self, memory: LaneMemory, drafting: bool, offsets: Sequence[int] = (),
               verify_offsets: Sequence[int] = ()) -> None:
        """Its state pieces are on pages (viewed by ``memory``; ``offsets``, ``verify_offsets``: where
        decode steps and verify rounds find them); ``drafting``: it verifies drafts."""
        self.memory = memory
        self.drafting = drafting
        self.offsets = tuple(offsets)
        self.verify_offsets = tuple(verify_offsets)

    def keeps_nothing(self) -> None:
        """No state is kept from it: its prompt is chunked as without a prompt cache."""
        self.keep_points = ()

    def reads_back(self, restoring: Restoring) -> None:
        """Its state is being read back from disk: it runs no rows until the read has ended."""
        self.restoring = restoring

    def read_ended(self) -> None:
        """The read of its state has ended without it going on (it left meanwhile, or going on failed)."""
        self.restoring = None

    def resumed(self, position: int, keep_points: tuple[int, ...]) -> None:
        """It goes on from ``position`` (resumed from a kept state; 0: the beginning), keeping
        states at ``keep_points``; a lane whose state was being read back runs again."""
        self.position = self.cached = position
        self.keep_points = keep_points
        self.restoring = None
        if self.phase is Phase.RESTORE:
            self.phase = Phase.PREFILL

    def joined_after_read(self, now: float) -> None:
        """It goes on at ``now`` (monotonic) after its state's read back: its first token's wait from
        here is logged."""
        self.joined_at = now

    def first_token_told(self) -> None:
        """Its first token after a read back was logged."""
        self.joined_at = None

    def released(self) -> None:
        """Its lease is finished and its views dropped (its pieces' pages may go to another lane)."""
        self.lease = self.memory = None
        self.offsets = self.verify_offsets = ()

    def open_failed(self) -> None:
        """Opening it failed (its lease finished): it holds nothing, resumed nothing, drafts nothing."""
        self.released()
        self.position = self.cached = 0
        self.drafting = False

    def advanced(self, position: int) -> None:
        """Its state holds the rows before ``position``."""
        self.position = position

    def verified(self, start: int, rows: int, kept: int, drafts: Sequence[int]) -> None:
        """A verify round of ``rows`` rows from ``start`` kept ``kept`` of them; ``drafts``: the
        next round's."""
        self.position = start + kept
        self.counts.add(rows - 1, kept)
        self.drafts = list(drafts)

    def drafted(self, drafts: Sequence[int]) -> None:
        """The drafts its next round verifies (a prompt's end absorbed by the MTP head)."""
        self.drafts = list(drafts)

    def record(self, token: int, now: float) -> None:
        """A token drawn for this lane: kept (its grammar past it), the lane decodes from here, the
        first one's time noted."""
        if self.grammar is not None:  # first: a token it refuses is not the lane's
            self.grammar.take(token)
        self.generated.append(token)
        self.drawn[token] = self.drawn.get(token, 0) + 1
        self.phase = Phase.DECODE
        if self.first_token_at is None:
            self.first_token_at = now

    def take(self, token: int, now: float) -> tuple[str, FinishReason | None]:
        """``record`` ``token``; the text it settles (none without a detokenizer) and, when it ends
        the lane, why: a stop token or stop string ("stop"), ``max_tokens`` reached ("length")."""
        stop_token = self.stopped_by(token)
        self.record(token, now)
        text = "" if self.detokenizer is None else self.detokenizer.add([token])
        if stop_token or (self.detokenizer is not None and self.detokenizer.stopped_at is not None):
            return text, "stop"
        return text, "length" if self.tokens_left <= 0 else None

    def describe(self) -> dict[str, object]:
        """What admin ``lanes`` shows of it."""
        lease = self.lease
        return {"lane": self.number, "request": self.request.id, "phase": self.phase.value,
                "prompt_tokens": self.prompt_length, "cached_tokens": self.cached,
                "generated": len(self.generated),
                "position": self.position, "window": self.request.window,
                "pages": None if lease is None else len(lease.row_pages) + len(lease.state_pages),
                "drafting": self.drafting, "rounds": self.counts.rounds, "drafted": self.counts.drafted,
                "accepted": self.counts.accepted}

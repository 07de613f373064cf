"""The step: plan, run, settle, record, finish. The one loop the engine thread, the bench and
``tfd generate`` drive.

``Stepper.step`` plans the step's rows (``Scheduler.plan``, admitting waiting lanes through the
runner), ends the lanes that were cancelled or could not be opened, runs the rows (``Runner.run``),
moves each lane past the rows it ran (``settle``), hands the runner the tokens (``Runner.drew``:
what the next step needs from them begins, its grammar masks), takes each lane's tokens one at a time by the
lane's finish rule (``Lane.take``) and ends the lanes that finished, their pages given back. It
answers with what happened (``Step``); the caller turns that into events, timings or text.

Error handling: a run that raises fails the lanes of that step (ended "failed", their pages back;
``Step.error`` holds what it raised) and the stepper goes on with the others; ``fail_all`` ends every
lane, for an engine that cannot go on. Synchronous; the thread that calls it owns the lanes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

import attrs

from tfd.engine.drawn import Drawn, settle
from tfd.engine.grammar import GrammarRefused
from tfd.engine.lane import Lane
from tfd.engine.request import FinishReason, TokenLogprob
from tfd.engine.runner import Runner
from tfd.engine.scheduler import Admission, Scheduler, Work

log = logging.getLogger("tfd.engine")


@attrs.frozen
class Emission:
    """The tokens a lane took this step (a verify round's may be several), the text they settled,
    and their log-probabilities when its request asked."""

    lane: Lane
    tokens: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprob, ...] | None


@attrs.frozen
class Ending:
    """A lane that ended this step, why, what is said of a failure, and the text held back until
    its end (stop strings ruled out)."""

    lane: Lane
    reason: FinishReason
    message: str = ""
    rest: str = ""


@attrs.frozen
class Step:
    """What one step did: lanes admitted, the rows it ran (``works``), the tokens taken and the lanes
    ended, in that order for each lane; ``ran_at``: the clock when the run's draws were on the host;
    ``run_s``: seconds from the run's launch to its tokens taken (the plan and admissions left out);
    ``error``: what a failed run raised."""

    admitted: tuple[Lane, ...]
    works: tuple[Work, ...]
    emitted: tuple[Emission, ...]
    ended: tuple[Ending, ...]
    ran_at: float
    run_s: float = 0.0
    error: Exception | None = None

    @property
    def rows(self) -> int:
        return sum(work.length for work in self.works)

    def raise_failures(self) -> None:
        """For a caller that runs its own requests (the bench, ``tfd generate``): raise what a failed
        run raised, or RuntimeError naming a lane that could not be opened (logged with its cause)."""
        if self.error is not None:
            raise self.error
        failed = [ending.message for ending in self.ended if ending.reason == "failed"]
        if failed:
            raise RuntimeError(failed[0])


class Stepper:
    """Steps of ``scheduler``'s lanes on ``runner``. ``clock``: the time lanes' tokens are noted at.
    ``leaves``: request id to the tokens after which that request is cancelled, as a client going
    away would be (the bench's and the tests'; a verify round's later tokens are not taken)."""

    def __init__(self, scheduler: Scheduler, runner: Runner, clock: Callable[[], float] = time.monotonic,
                 leaves: Mapping[str, int] | None = None) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.clock = clock
        self.leaves = leaves or {}

    def add(self, lane: Lane) -> None:
        """Queue ``lane`` for admission."""
        self.scheduler.add(lane)

    @property
    def idle(self) -> bool:
        """No lane waits or runs, and no state is being read back into pages a lane held."""
        return self.scheduler.idle and not self.runner.restoring

    def step(self) -> Step:
        """One step (``Step``); a step with nothing to run still ends cancelled lanes. A lane whose
        state is read back from disk counts as admitted in the step where the read has ended."""
        started, broken = self.runner.settle_restores()
        admitted: list[Lane] = list(started)

        def admit(lane: Lane) -> Admission:
            outcome = self.runner.admit(lane, self.scheduler.load)
            if outcome is Admission.ADMITTED and lane.restoring is None:
                admitted.append(lane)
            return outcome

        plan = self.scheduler.plan(admit)
        ended = [self.end(lane, "cancelled") for lane in plan.cancelled]
        failed = "server error: the lane could not be opened"
        ended += [self.end(lane, "failed", failed) for lane in (*broken, *plan.dropped)]
        if not plan.works:
            return Step(tuple(admitted), (), (), tuple(ended), self.clock())
        began = time.monotonic()
        try:
            drawn = self.runner.run(plan.works)
        except Exception as error:
            ended += [self.end(work.lane, "failed", f"server error: {error}") for work in plan.works]
            return Step(tuple(admitted), plan.works, (), tuple(ended), self.clock(), time.monotonic() - began,
                        error)
        ran_at = self.clock()
        settle(plan.works, drawn)
        self.runner.drew(drawn)  # the next step's masks fill while the lanes take their tokens
        emitted = self._take(drawn, ran_at, ended)
        self.runner.took()
        run_s = time.monotonic() - began
        step = Step(tuple(admitted), plan.works, tuple(emitted), tuple(ended), ran_at, run_s)
        for emission in emitted:  # where a resumed turn's first token waits: its last part
            lane = emission.lane
            if lane.joined_at is not None and emission.tokens:
                log.info("request %s's first token, its state read back, came %.3f s after it went on, in a "
                         "step of %.3f s and %d rows", lane.request.id, time.monotonic() - lane.joined_at,
                         run_s, step.rows)
                lane.first_token_told()
        return step

    def _take(self, drawn: Sequence[Drawn], now: float, ended: list[Ending]) -> list[Emission]:
        """Each lane's drawn tokens taken one at a time (a round's later tokens may come after its
        end); the lanes that finished ended."""
        emitted = []
        for item in drawn:
            lane, taken, text = item.work.lane, [], ""
            reason: FinishReason | None = None
            for token in item.tokens:
                try:
                    said, reason = lane.take(token, now)
                except GrammarRefused as refused:  # that lane fails, the others go on
                    ended.append(self.end(lane, "failed", f"server error: {refused}"))
                    break
                taken.append(token)
                text += said
                if reason is None and self.leaves.get(lane.request.id) == len(lane.generated):
                    lane.cancel()  # it leaves at the next plan, as a cancel does
                if reason is not None or lane.cancelled:
                    break
            logprobs = None if item.logprobs is None else item.logprobs[:len(taken)]
            emitted.append(Emission(lane, tuple(taken), text, logprobs))
            if reason is not None:
                ended.append(self.end(lane, reason))
        return emitted

    def end(self, lane: Lane, reason: FinishReason, message: str = "") -> Ending:
        """End ``lane``: its pages back, out of the scheduler; the text its detokenizer held back."""
        words = lane.detokenizer
        rest = words.finish() if words is not None and reason in ("stop", "length") else ""
        self.runner.close(lane)
        self.scheduler.retire(lane)
        return Ending(lane, reason, message, rest)

    def fail_all(self, lanes: Sequence[Lane], message: str) -> list[Ending]:
        """End ``lanes`` as failed, for an engine that cannot go on."""
        return [self.end(lane, "failed", message) for lane in lanes]

"""The engine: one thread owns the device and runs steps; the trio side submits and listens.

Threads: ``submit``, ``cancel`` and ``ask`` are called from the trio thread; they only put a
message in the engine's inbox and wake it. The engine thread alone touches lanes, the scheduler,
the pool and the model. Once a step it hands the step's events back with
``TrioToken.run_sync_soon``, and the trio thread fans them out to each request's memory channel.

Resource handling: a lane's pages go back when it finishes, is cancelled, or fails; ``close``
cancels what is left, ends the thread, and waits for it. Error handling: a step that raises fails
the lanes it ran (``Finished("failed")``, pages returned) and the engine goes on with the others;
an error outside a step stops the engine, fails every lane, and calls ``on_failure``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import tokenizers
import trio

from tfd.engine.cache_face import CLEAR, CacheFace
from tfd.engine.config import EngineConfig, Hooks
from tfd.engine.detokenize import Detokenizer
from tfd.engine.lane import Lane
from tfd.engine.lockstep import Cancelled, Follower, Lockstep, Mirrored, Shared, Stopped, Submitted
from tfd.engine.request import Admitted, Emitted, Event, Finished, Request
from tfd.engine.runner import Runner
from tfd.engine.scheduler import Scheduler
from tfd.engine.stepper import Ending, Stepper
from tfd.families.hybrid import HybridModel
from tfd.pool.pages import Pool

log = logging.getLogger("tfd.engine")
IDLE_WAIT_S = 1.0  # an idle engine still beats this often


class EngineError(Exception):
    """A request refused before it reached the engine; ``status`` is the HTTP answer."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        self.status = status
        self.code = code
        self.param = param
        super().__init__(message)


@attrs.define
class StepStats:
    steps: int = 0
    rows: int = 0
    last_step_s: float = 0.0
    prompt_tokens: int = 0
    generated_tokens: int = 0


@attrs.frozen
class Submit:
    request: Request
    posted: float = attrs.Factory(time.monotonic)  # when the trio side queued it


@attrs.frozen
class Cancel:
    request_id: str


@attrs.frozen
class Ask:
    """Run ``question`` between steps; its value (or what it raised) goes to ``answer`` on the trio
    thread. ``mirror``: the name other ranks make the same change by (``Engine.mirrors``)."""

    question: Callable[[], Any]
    answer: Callable[[Any], None]
    mirror: str | None = None


@attrs.frozen
class Stop:
    """Cancel what runs, then end the thread once nothing is left."""


Message = Submit | Cancel | Ask | Stop  # what the trio side puts in the engine's inbox


class Handle:
    """The trio side of one request: its events, ending with ``Finished``."""

    def __init__(self, request: Request, send: trio.MemorySendChannel[Event],
                 receive: trio.MemoryReceiveChannel[Event]) -> None:
        self.request = request
        self.send = send
        self.events = receive
        self.admitted = False
        self.finished = False


class Engine:
    """``model`` served from ``pool`` as ``config`` says, its text by ``tokenizer``; ``hooks``: the
    calls back to the host. Its runner is built here (CUDA graphs captured: seconds)."""

    def __init__(self, model: HybridModel, tokenizer: tokenizers.Tokenizer, pool: Pool, config: EngineConfig,
                 hooks: Hooks | None = None, lockstep: Lockstep | None = None) -> None:
        hooks = hooks or Hooks()
        self.lockstep = lockstep  # tensor parallel: rank 0 shares each step's messages, the others take them
        # another rank's changes between steps, by the name rank 0's ``ask`` gave them (more: its owner's)
        self.mirrors: dict[str, Callable[[Engine], object]] = {CLEAR: lambda engine: engine.cache.clear_now()}
        self.tokenizer = tokenizer
        self.pool = pool
        self.limits = limits = config.limits
        self.beat = hooks.beat  # once a step, and at least every IDLE_WAIT_S: the watchdog's heartbeat
        self.on_failure = hooks.on_failure
        self.on_step = hooks.on_step  # (seconds, rows) after each step, on the trio thread
        self.scheduler = Scheduler(limits.step_tokens, limits.max_lanes)
        self.runner = Runner(model, pool, limits.context, limits.max_lanes, config.graphs, config.drafting,
                             kept_bytes=config.kept_bytes, keep_gain=config.keep_gain)
        self.stepper = Stepper(self.scheduler, self.runner)
        self.cache = CacheFace(self.runner.cache, pool, limits.context, self.ask, limits.max_lanes)
        if lockstep is not None:  # what each rank does apart (reads back, writes) is taken at its least
            self.runner.opener.least = lockstep.least
            if self.runner.cache is not None:
                self.runner.cache.least = lockstep.least
        self.stats = StepStats()
        self.failure: BaseException | None = None
        self.last_step_error: Exception | None = None  # what the latest step that failed raised
        self._inbox: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self._wake = threading.Event()
        if self.runner.cache is not None:  # a lane's state read back: its next step need not wait a beat
            self.runner.cache.on_restored = self._wake.set
        self._lanes: dict[str, Lane] = {}  # engine thread
        self._handles: dict[str, Handle] = {}  # trio thread
        self._queued = 0  # trio thread: submitted, not yet admitted
        self._numbers = 0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None

    # -- the trio side ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine thread; call from the trio thread that will receive events."""
        self._token = trio.lowlevel.current_trio_token()
        self.cache.start()
        self._thread = threading.Thread(target=self._main, name="tfd-engine", daemon=True)
        self._thread.start()

    @property
    def running(self) -> int:
        return len(self.scheduler.running)

    @property
    def waiting(self) -> int:
        return self._queued

    @property
    def drafts(self) -> bool:
        """Whether lanes that ask verify the MTP head's drafts."""
        return self.runner.rounds is not None

    async def lanes(self) -> list[dict[str, object]]:
        """What admin ``lanes`` shows: every lane running, then every lane waiting."""
        scheduler = self.scheduler
        found: list[dict[str, object]] = await self.ask(
            lambda: [lane.describe() for lane in [*scheduler.running, *scheduler.waiting]])
        return found

    def submit(self, request: Request, *, internal: bool = False) -> Handle:
        """Queue ``request``; raises ``EngineError`` for a window over the context or a full queue.
        ``internal``: the daemon's own work (warm-up, probes), which the clients' queue limit does not
        bound (a limit of 0 means clients queue nothing, not that the daemon cannot start)."""
        if self.failure is not None:
            raise EngineError(503, "engine_failed", "the engine has stopped after an error")
        if request.window > self.limits.context:
            raise EngineError(
                400, "context_length_exceeded",
                f"This server's maximum context length is {self.limits.context} tokens. However, you "
                f"requested {request.window} tokens ({len(request.prompt)} in the prompt, "
                f"{request.max_tokens} in the completion).", "messages")
        if self._queued >= self.limits.queue and not internal:
            raise EngineError(503, "queue_full",
                              f"{self._queued} requests are already waiting; try again later")
        if request.id in self._handles:
            raise EngineError(400, "duplicate_request", f"request id {request.id} is already running")
        send, receive = trio.open_memory_channel[Event](math.inf)
        handle = Handle(request, send, receive)
        self._handles[request.id] = handle
        self._queued += 1
        self._post(Submit(request))
        return handle

    def has(self, request_id: str) -> bool:
        """Whether a request of this id was submitted and has not finished yet (trio thread)."""
        return request_id in self._handles

    def cancel(self, request_id: str) -> None:
        """Stop a request at the next step boundary; its ``Finished("cancelled")`` still comes."""
        self._post(Cancel(request_id))

    async def ask(self, question: Callable[[], Any], mirror: str | None = None) -> Any:
        """Run ``question`` on the engine thread between steps (a consistent view) and return it;
        ``mirror``: it changes what steps do, and the other ranks make the change by that name."""
        done = trio.Event()
        box: list[Any] = []

        def answer(value: Any) -> None:
            box.append(value)
            done.set()

        self._post(Ask(question, answer, mirror))
        await done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    async def close(self) -> None:
        """Cancel what runs, stop the thread and wait for it, then let the prompt states offered to
        the disk be written."""
        self._post(Stop())
        if self._thread is not None:
            await trio.to_thread.run_sync(self._thread.join)
        await self.cache.close()

    def _post(self, message: Message) -> None:
        self._inbox.put(message)
        self._wake.set()

    def _dispatch(self, events: Sequence[tuple[str, Event]], seconds: float, rows: int) -> None:
        for request_id, event in events:
            handle = self._handles.get(request_id)
            if handle is None:
                continue
            if isinstance(event, Admitted) or (isinstance(event, Finished) and not handle.admitted):
                if not handle.admitted:
                    self._queued -= 1
                handle.admitted = True
            handle.send.send_nowait(event)
            if isinstance(event, Finished):
                handle.finished = True
                handle.send.close()
                del self._handles[request_id]
        if rows and self.on_step is not None:
            self.on_step(seconds, rows)

    # -- the engine thread ---------------------------------------------------------------------

    def _main(self) -> None:
        try:
            while self._step():
                pass
        except BaseException as error:  # the engine cannot go on: fail everything, say so
            log.exception("engine stopped")
            self.failure = error
            ended = self.stepper.fail_all(list(self._lanes.values()), "the engine stopped after an error")
            self._deliver(self._finished(ended), 0.0, 0)
            if self.on_failure is not None and self._token is not None:
                self._call_trio(self.on_failure, error)

    def _step(self) -> bool:
        """One step; False when the engine should stop."""
        self._wake.clear()
        self._read_inbox()
        if self._stopping:
            for lane in self._lanes.values():
                lane.cancel()
        step = self.stepper.step()
        seconds = step.run_s
        events: list[tuple[str, Event]] = []
        for lane in step.admitted:
            self.stats.prompt_tokens += lane.prompt_length
            events.append((lane.request.id, Admitted(lane.prompt_length, lane.cached)))
        for emission in step.emitted:
            self.stats.generated_tokens += len(emission.tokens)
            events.append((emission.lane.request.id,
                           Emitted(emission.tokens, emission.text, emission.logprobs)))
        events += self._finished(step.ended)
        if step.error is not None:
            self.last_step_error = step.error
            log.error("a step failed; failing its %d lanes", len(step.works), exc_info=step.error)
        if step.works:
            self.stats.steps += 1
            self.stats.rows += step.rows
            self.stats.last_step_s = seconds
        self._deliver(events, seconds, step.rows)
        if self.beat is not None:
            self.beat()
        if self._stopping and self.stepper.idle and not self._lanes:
            return False
        if not step.works and not isinstance(self.lockstep, Follower):  # a follower waits in agree
            self._wake.wait(IDLE_WAIT_S)
        return True

    def follow(self) -> None:
        """Another rank's engine: run the steps rank 0 shares, on this thread, until it stops."""
        assert isinstance(self.lockstep, Follower)
        self._main()
        if self.failure is not None:
            raise self.failure

    def _read_inbox(self) -> None:
        messages: list[Message] = []
        while True:
            try:
                messages.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        if isinstance(self.lockstep, Follower):
            for item in self.lockstep.agree([]):
                self._apply_shared(item)
            return
        if self.lockstep is not None:
            self.lockstep.agree([shared for message in messages if (shared := _shared(message)) is not None])
        for message in messages:
            if isinstance(message, Submit):
                self._add(message.request, message.posted)
            elif isinstance(message, Cancel):
                self._cancel(message.request_id)
            elif isinstance(message, Ask):
                try:
                    value = message.question()
                except Exception as error:
                    value = error
                self._call_trio(message.answer, value)
            else:
                self._stopping = True

    def _apply_shared(self, item: Shared) -> None:
        """A message rank 0 shared, made here (another rank's engine)."""
        if isinstance(item, Submitted):  # shared through agree, not queued: taken as it is made
            self._add(item.request, time.monotonic())
        elif isinstance(item, Cancelled):
            self._cancel(item.request_id)
        elif isinstance(item, Mirrored):
            self.mirrors[item.name](self)
        else:
            self._stopping = True

    def _cancel(self, request_id: str) -> None:
        found = self._lanes.get(request_id)
        if found is not None:
            found.cancel()

    def _add(self, request: Request, posted: float) -> None:
        """A lane for ``request``, queued for this thread at ``posted`` (monotonic)."""
        self._numbers += 1
        lane = Lane(self._numbers, request, Detokenizer(self.tokenizer, request.stop),
                    leader=None if request.after is None else self._lanes.get(request.after), posted=posted)
        self._lanes[request.id] = lane
        self.stepper.add(lane)

    def _finished(self, ended: Sequence[Ending]) -> list[tuple[str, Event]]:
        """The ``Finished`` events of lanes the stepper ended, which the engine forgets."""
        events: list[tuple[str, Event]] = []
        for ending in ended:
            lane = ending.lane
            self._lanes.pop(lane.request.id, None)
            ttft = None if lane.first_token_at is None else lane.first_token_at - lane.request.arrived
            counts = lane.counts
            steps = 1 + counts.rounds if lane.drafting and lane.generated else len(lane.generated)
            events.append((lane.request.id, Finished(
                ending.reason, tuple(lane.generated), ending.rest, ending.message, lane.prompt_length,
                lane.cached, ttft, counts.drafted, counts.accepted, steps, counts.narrowest)))
        return events

    def _deliver(self, events: list[tuple[str, Event]], seconds: float, rows: int) -> None:
        if events or rows:
            self._call_trio(self._dispatch, events, seconds, rows)

    def _call_trio(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._token is None:
            return
        with contextlib.suppress(trio.RunFinishedError):  # trio has exited: nobody listens any more
            self._token.run_sync_soon(fn, *args)


def _shared(message: Message) -> Shared | None:
    """What other ranks must hear of ``message`` (a request without its compiled grammar), or None."""
    if isinstance(message, Submit):
        grammar = message.request.grammar
        if grammar is None:
            return Submitted(message.request)
        return Submitted(attrs.evolve(message.request, grammar=None), grammar.text, grammar.lanes)
    if isinstance(message, Cancel):
        return Cancelled(message.request_id)
    if isinstance(message, Ask):
        return None if message.mirror is None else Mirrored(message.mirror)
    return Stopped()

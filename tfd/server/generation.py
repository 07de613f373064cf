"""A generating request in the engine: its choices submitted, their events read into the reply.

A request of ``n`` choices is ``n`` engine requests: choice 0 under the request's id, choice ``i``
under ``<id>#<i>`` (``#`` is in no client's id), drawn with the seed ``seed + i`` (a request without
a seed: its prompt's seed plus ``i``), so choice ``i`` is what the same request with ``n`` 1 and
that seed gives. Where the first keeps a state of its prompt (a prompt cache, the request's
``cache``, a prompt past a chunk), the choices after it wait for its prompt to go through and resume
from that state (``Request.after``): the prompt is prefilled once.

Resource handling: the request counts as running work (``Lifecycle``) from submission to its last
byte, so a drain waits for it. Every choice submitted is cancelled if a later one is refused; a
client that goes away cancels every choice (a stream's generator is closed before its access line
is written, ``ClosedStream``; a whole reply watches the connection while it waits); the engine
stops their lanes at its next step boundary, and the access line's finish says ``disconnected``.
A stream sends its choices one after the other (choice 0 live, the others' events waiting in their
unbounded channels meanwhile).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import attrs
import trio
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from tfd.engine.engine import EngineError, Handle
from tfd.engine.request import Emitted, Event, Finished, Request, prompt_seed
from tfd.server.access import Exchange
from tfd.server.http import ClosedStream, error_response
from tfd.server.lifecycle import Lifecycle, NotAdmitting
from tfd.server.metrics import Metrics
from tfd.server.replies import Reply, sse
from tfd.server.schema import SEED_MASK
from tfd.server.service import Service

RETRY_AFTER_S = "2"


class Refusal(Exception):
    """A refusal before any reply byte: its error answer, and the code the access line names."""

    def __init__(self, status: int, message: str, code: str, *, param: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        self.code = code
        self.response = error_response(status, message, code, param=param, headers=headers)


def choices(request: Request, n: int, shared: bool) -> list[Request]:
    """``request``'s ``n`` choices as engine requests (see the module's docstring); ``shared``: the
    first keeps a state of its prompt that the others resume from."""
    if n == 1:
        return [request]
    seed = request.sampling.seed if request.sampling.seed is not None else prompt_seed(request.prompt)
    after = request.id if shared else None
    return [request] + [attrs.evolve(request, id=f"{request.id}#{i}", after=after,
                                     sampling=attrs.evolve(request.sampling, seed=(seed + i) & SEED_MASK))
                        for i in range(1, n)]


class Generation:
    """One request's choices from submission to the reply's last byte."""

    def __init__(self, lifecycle: Lifecycle, metrics: Metrics, service: Service, exchange: Exchange,
                 reply: Reply) -> None:
        self.lifecycle = lifecycle
        self.metrics = metrics
        self.service = service
        self.exchange = exchange
        self.reply = reply
        self.handles: list[Handle] = []

    def submit(self, requests: Sequence[Request]) -> None:
        """Submit every choice, counting the request as work; raises ``Refusal`` (nothing left
        submitted) when the server is not admitting or the engine refuses a choice."""
        try:
            self.lifecycle.begin_work()
        except NotAdmitting as refusal:
            raise Refusal(503, str(refusal), refusal.phase.value,
                          headers={"Retry-After": RETRY_AFTER_S}) from None
        try:
            for request in requests:
                self.handles.append(self.service.engine.submit(request))
        except EngineError as error:
            self._cancel()
            self.lifecycle.end_work()
            headers = {"Retry-After": RETRY_AFTER_S} if error.status == 503 else None
            if error.param == "messages" and self.reply.api == "completion":
                error.param = "prompt"
            raise Refusal(error.status, str(error), error.code, param=error.param, headers=headers) from None

    def stream(self, include_usage: bool) -> Response:
        return ClosedStream(self._stream(include_usage), media_type="text/event-stream",
                            headers={"Cache-Control": "no-cache"})

    async def whole(self, http: HttpRequest) -> tuple[list[Finished], bool]:
        """Every choice's last event, and whether the client left meanwhile (then all are cancelled)."""
        left = False

        async def watch() -> None:
            nonlocal left
            while (await http.receive())["type"] != "http.disconnect":
                pass
            left = True
            self._cancel()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                finished = [await self._events(i) for i in range(len(self.handles))]
                nursery.cancel_scope.cancel()
        finally:
            self.lifecycle.end_work()
        if left and any(done.reason == "cancelled" for done in finished):
            self.exchange.finish = "disconnected"
        return finished, left

    async def _events(self, index: int) -> Finished:
        async for event in self.handles[index].events:
            self._saw(event, index)
            if isinstance(event, Emitted):
                self.reply.add(event, index)
            elif isinstance(event, Finished):
                return event
        raise RuntimeError("the engine closed a request without finishing it")

    def _saw(self, event: Event, index: int) -> None:
        """Choice ``index``'s event counted: the first choice's in the access line, every choice's end
        in the metrics and the line's tokens."""
        if index == 0:
            self.exchange.saw(event)
        if isinstance(event, Finished):
            self._count(event)
            if index:
                self.exchange.another(event)

    async def _stream(self, include_usage: bool) -> AsyncGenerator[bytes, None]:
        done = False
        reply = self.reply
        finished: list[Finished] = []
        try:
            for chunk in reply.first_chunks():
                yield sse(_usage_null(chunk, include_usage))
            for index, handle in enumerate(self.handles):
                async for event in handle.events:
                    self._saw(event, index)
                    if isinstance(event, Emitted):
                        for chunk in reply.delta_chunks(event, index):
                            yield sse(_usage_null(chunk, include_usage))
                    elif isinstance(event, Finished):
                        finished.append(event)
                        if event.reason == "failed":
                            yield sse({"error": {"message": event.message or "the request failed",
                                                 "type": "server_error", "param": None,
                                                 "code": "server_error"}})
                            yield sse("[DONE]")
                            done = True
                            return
                        for chunk in reply.last_chunks(event, index):
                            yield sse(_usage_null(chunk, include_usage))
                        break
            if include_usage:
                yield sse(reply.usage_chunk(finished))
            done = True
            yield sse("[DONE]")
        finally:
            if not done:  # the client went away, or the server is stopping: free the lanes
                self._cancel()
                self.exchange.finish = "disconnected"
            elif len(finished) < len(self.handles):  # a choice failed: the others are of no use
                self._cancel()
            self.lifecycle.end_work()

    def _cancel(self) -> None:
        for handle in self.handles:
            self.service.engine.cancel(handle.request.id)

    def _count(self, finished: Finished) -> None:
        self.metrics.tokens.labels("prompt").inc(finished.prompt_tokens)
        self.metrics.tokens.labels("cached").inc(finished.cached_tokens)
        self.metrics.tokens.labels("generated").inc(len(finished.tokens))
        self.metrics.count_drafts(finished.drafted, finished.accepted)
        if finished.time_to_first_token is not None:
            self.metrics.first_token.observe(finished.time_to_first_token)
        self.metrics.finished.labels(finished.reason).inc()


def _usage_null(chunk: dict[str, Any], asked: bool) -> dict[str, Any]:
    """A chunk before the usage one, as OpenAI streams it when the usage is asked: ``"usage": null``."""
    if asked:
        chunk["usage"] = None
    return chunk

"""The OpenAI-compatible routes: chat and text completions (whole or streamed), models, tokenize.

A request is read and checked (``tfd.server.schema``), its prompt tokenized, and submitted to the
engine; every refusal (a malformed body, an unknown model, a prompt over the context, a full
queue, a draining server) is an HTTP error before any stream byte. A streamed reply is server-sent
events: the role, the text deltas, the last chunk with ``finish_reason`` and the ``tfd`` block, with
``stream_options.include_usage`` a chunk of the usage (and ``"usage": null`` on every chunk before
it, as OpenAI sends), then ``[DONE]``.

A generating request gets its id first (``tfd.server.access``: the client's ``x-request-id`` as the
base, else a fresh one), so every answer of these routes but a malformed id's refusal carries it;
the id is the engine's, the reply's and the access line's. The route feeds the engine's events to
its access line (tokens, time to first token, finish) and names the code of any refusal.

Resource handling: a request counts as running work (``Lifecycle``) from submission to its last
byte, so a drain waits for it. A client that goes away cancels its request: a stream's generator
is cancelled when the client disconnects and closed before its access line is written
(``ClosedStream``), and a whole reply watches the connection while it waits; either way the
engine stops the lane at its next step boundary, and the access line's finish says ``disconnected``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import trio
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tfd.chat import ChatTemplateError
from tfd.engine.engine import EngineError, Handle
from tfd.engine.request import Emitted, Finished, Request
from tfd.server.access import HEADER, Access, Exchange, exchange_of
from tfd.server.description import description
from tfd.server.http import ClosedStream, error_response
from tfd.server.lifecycle import Lifecycle, NotAdmitting
from tfd.server.metrics import Metrics
from tfd.server.replies import Api, Reply, sse
from tfd.server.schema import BadRequest, Common, chat_body, check_bias, completion_body
from tfd.server.service import Service

RETRY_AFTER_S = "2"
MAX_BODY = 32 << 20
# What a generating route's body gives: the prompt's token ids, the common fields, the keep marks.
Prompt = tuple[tuple[int, ...], Common, tuple[int, ...]]


class OpenAI:
    def __init__(self, lifecycle: Lifecycle, metrics: Metrics, service: Callable[[], Service | None],
                 access: Access | None = None) -> None:
        self.lifecycle = lifecycle
        self.metrics = metrics
        self.service = service
        self.access = access if access is not None else Access()
        self._description: dict[str, Any] | None = None

    def routes(self) -> list[Route]:
        return [Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/models/{model:path}", self.model, methods=["GET"]),
                Route("/tokenize", self.tokenize, methods=["POST"]),
                Route("/detokenize", self.detokenize, methods=["POST"]),
                Route("/openapi.json", self.description, methods=["GET"])]

    async def description(self, request: HttpRequest) -> Response:
        """The OpenAPI description (``tfd.server.description``) of the model served, built once."""
        try:
            service = self._ready()
        except _Refusal as refusal:
            return refusal.response
        if self._description is None:
            self._description = description(service.loaded.model.cfg.vocab)
        return JSONResponse(self._description)

    async def chat(self, request: HttpRequest) -> Response:
        return await self._answer(request, "chat", self._chat_prompt)

    async def completions(self, request: HttpRequest) -> Response:
        return await self._answer(request, "completion", self._completion_prompt)

    async def _answer(self, http: HttpRequest, api: Api,
                      prompt: Callable[[HttpRequest, Service], Awaitable[Prompt]]) -> Response:
        """A generating route: the request's id first, then ``prompt`` read from the body and run;
        a refusal answers its error, its code noted for the access line."""
        exchange = exchange_of(http)
        try:
            current = self.service()
            self.access.assign(exchange, api, http.headers.get(HEADER),
                               lambda found: current is not None and current.engine.has(found))
            service = self._ready()
            ids, common, marks = await prompt(http, service)
            check_bias(common.sampling, service.loaded.model.cfg.vocab)
            return await self._generate(http, exchange, service, api, ids, common, marks)
        except _Refusal as refusal:
            exchange.error = refusal.code
            return refusal.response
        except BadRequest as error:
            exchange.error = error.code
            return error_response(400, str(error), error.code, param=error.param)

    async def _chat_prompt(self, http: HttpRequest, service: Service) -> Prompt:
        body = chat_body(await _json(http))
        self._check_model(service, body.common.model)
        template = service.loaded.template
        if template is None:
            raise BadRequest("this model has no chat template; use /v1/completions", "messages")
        try:
            text = template.render(list(body.messages), add_generation_prompt=True, **body.template_kwargs)
        except ChatTemplateError as error:
            raise BadRequest(f"the chat template refused the messages: {error.message}", "messages") from None
        ids = tuple(service.loaded.tokenizer.encode(text, add_special_tokens=False).ids)
        return ids, body.common, _latest_user_mark(service, body.messages, body.template_kwargs, ids)

    async def _completion_prompt(self, http: HttpRequest, service: Service) -> Prompt:
        body = completion_body(await _json(http))
        self._check_model(service, body.common.model)
        if isinstance(body.prompt, str):
            ids = tuple(service.loaded.tokenizer.encode(body.prompt, add_special_tokens=False).ids)
            return ids, body.common, ()
        vocab = service.loaded.model.cfg.vocab
        if max(body.prompt) >= vocab:
            raise BadRequest(f"prompt holds token ids past the vocabulary of {vocab}", "prompt")
        return body.prompt, body.common, ()

    async def models(self, request: HttpRequest) -> Response:
        try:
            service = self._ready()
        except _Refusal as refusal:
            return refusal.response
        return JSONResponse({"object": "list", "data": [self._model_entry(service)]})

    async def model(self, request: HttpRequest) -> Response:
        """``/v1/models/{model}``: the served model's entry, or 404 for another name."""
        try:
            service = self._ready()
            self._check_model(service, request.path_params["model"])
        except _Refusal as refusal:
            return refusal.response
        return JSONResponse(self._model_entry(service))

    def _model_entry(self, service: Service) -> dict[str, object]:
        entry: dict[str, object] = {"id": service.name, "object": "model",
                                    "created": int(self.lifecycle.started_wall), "owned_by": "tfd",
                                    "max_model_len": service.engine.limits.context}
        loaded = service.loaded
        indexer = loaded.model.cfg.indexer
        if indexer is not None:  # past it a query attends the best blocks only: what a long test must pass
            entry["sparse_attention_budget"] = indexer.budget
        if loaded.random_weights:  # said where a client looks: its replies are noise
            entry["random_weights"] = True
            if loaded.shape is not None:
                entry["shape"] = loaded.shape.name
                entry["cut"] = loaded.shape.cut
        return entry

    async def tokenize(self, request: HttpRequest) -> Response:
        try:
            service = self._ready()
            body = await _json(request)
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            if "messages" in body:
                chat = chat_body(body)
                template = service.loaded.template
                if template is None:
                    raise BadRequest("this model has no chat template", "messages")
                add = body.get("add_generation_prompt", True)
                if not isinstance(add, bool):
                    raise BadRequest("add_generation_prompt must be a boolean", "add_generation_prompt")
                text = template.render(list(chat.messages), add_generation_prompt=add, **chat.template_kwargs)
            elif isinstance(body.get("prompt"), str):
                text = body["prompt"]
            else:
                raise BadRequest("give prompt (a string) or messages", "prompt")
        except _Refusal as refusal:
            return refusal.response
        except BadRequest as error:
            return error_response(400, str(error), error.code, param=error.param)
        ids = service.loaded.tokenizer.encode(text, add_special_tokens=False).ids
        return JSONResponse({"tokens": ids, "count": len(ids),
                             "max_model_len": service.engine.limits.context})

    async def detokenize(self, request: HttpRequest) -> Response:
        try:
            service = self._ready()
            body = await _json(request)
            tokens = body.get("tokens") if isinstance(body, dict) else None
            vocab = service.loaded.model.cfg.vocab
            if not isinstance(tokens, list) or not all(
                    isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in tokens):
                raise BadRequest(f"tokens must be an array of token ids below {vocab}", "tokens")
        except _Refusal as refusal:
            return refusal.response
        except BadRequest as error:
            return error_response(400, str(error), error.code, param=error.param)
        return JSONResponse({"prompt": service.loaded.tokenizer.decode(tokens, skip_special_tokens=False)})

    def _ready(self) -> Service:
        service = self.service()
        if service is None or not self.lifecycle.admitting:
            state = self.lifecycle.phase.value
            raise _Refusal(503, f"the server is {state}; try again later", state,
                           headers={"Retry-After": RETRY_AFTER_S})
        return service

    @staticmethod
    def _check_model(service: Service, model: str | None) -> None:
        if model is not None and model != service.name:
            raise _Refusal(404, f"the model {model} does not exist; this server serves {service.name}",
                           "model_not_found", param="model")

    async def _generate(self, http: HttpRequest, exchange: Exchange, service: Service, api: Api,
                        ids: tuple[int, ...], common: Common, marks: tuple[int, ...] = ()) -> Response:
        if not ids:
            raise BadRequest("the prompt has no tokens", "prompt" if api == "completion" else "messages")
        assert exchange.id is not None  # _answer gave it
        exchange.prompt = len(ids)
        context = service.engine.limits.context
        max_tokens = common.max_tokens if common.max_tokens is not None else max(context - len(ids), 1)
        stop_ids = () if common.ignore_eos else service.loaded.eos_ids
        # arrived is when the HTTP request came: the time to first token counts reading and tokenizing
        request = Request(exchange.id, ids, max_tokens, common.sampling, common.stop, stop_ids,
                          arrived=exchange.started, draft=common.draft, keep_at=marks, cache=common.cache,
                          min_tokens=common.min_tokens)
        try:
            self.lifecycle.begin_work()
        except NotAdmitting as refusal:
            raise _Refusal(503, str(refusal), refusal.phase.value,
                           headers={"Retry-After": RETRY_AFTER_S}) from None
        try:
            handle = service.engine.submit(request)
        except EngineError as error:
            self.lifecycle.end_work()
            headers = {"Retry-After": RETRY_AFTER_S} if error.status == 503 else None
            if error.param == "messages" and api == "completion":
                error.param = "prompt"
            raise _Refusal(error.status, str(error), error.code, param=error.param, headers=headers) from None
        reply = Reply(api, exchange.id, service.name, ids, service.loaded.tokenizer, common.return_token_ids)
        if common.stream:
            return ClosedStream(self._stream(service, handle, reply, exchange, common.include_usage),
                                media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        try:
            finished = await self._collect(http, service, handle, reply, exchange)
        finally:
            self.lifecycle.end_work()
        if finished.reason == "failed":
            exchange.error = "server_error"
            return error_response(500, finished.message or "the request failed", "server_error")
        return JSONResponse(reply.whole(finished))

    async def _collect(self, http: HttpRequest, service: Service, handle: Handle, reply: Reply,
                       exchange: Exchange) -> Finished:
        """The whole reply; a client that disconnects meanwhile cancels the request."""
        left = False

        async def watch() -> None:
            nonlocal left
            while (await http.receive())["type"] != "http.disconnect":
                pass
            left = True
            service.engine.cancel(handle.request.id)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            finished = await self._events(handle, reply, exchange)
            nursery.cancel_scope.cancel()
        if left and finished.reason == "cancelled":
            exchange.finish = "disconnected"
        return finished

    async def _events(self, handle: Handle, reply: Reply, exchange: Exchange) -> Finished:
        async for event in handle.events:
            exchange.saw(event)
            if isinstance(event, Emitted):
                reply.add(event)
            elif isinstance(event, Finished):
                self._count(event)
                return event
        raise RuntimeError("the engine closed a request without finishing it")

    async def _stream(self, service: Service, handle: Handle, reply: Reply, exchange: Exchange,
                      include_usage: bool) -> AsyncGenerator[bytes, None]:
        done = False
        try:
            yield sse(_usage_null(reply.first_chunk(), include_usage))
            async for event in handle.events:
                exchange.saw(event)
                if isinstance(event, Emitted):
                    if event.text or event.logprobs or reply.return_token_ids:
                        yield sse(_usage_null(reply.delta_chunk(event), include_usage))
                elif isinstance(event, Finished):
                    self._count(event)
                    if event.reason == "failed":
                        yield sse({"error": {"message": event.message or "the request failed",
                                             "type": "server_error", "param": None, "code": "server_error"}})
                    else:
                        yield sse(_usage_null(reply.last_chunk(event), include_usage))
                        if include_usage:
                            yield sse(reply.usage_chunk(event))
                    done = True
            yield sse("[DONE]")
        finally:
            if not done:  # the client went away, or the server is stopping: free the lane
                service.engine.cancel(handle.request.id)
                exchange.finish = "disconnected"
            self.lifecycle.end_work()

    def _count(self, finished: Finished) -> None:
        self.metrics.tokens.labels("prompt").inc(finished.prompt_tokens)
        self.metrics.tokens.labels("cached").inc(finished.cached_tokens)
        self.metrics.tokens.labels("generated").inc(len(finished.tokens))
        self.metrics.count_drafts(finished.drafted, finished.accepted)
        if finished.time_to_first_token is not None:
            self.metrics.first_token.observe(finished.time_to_first_token)
        self.metrics.finished.labels(finished.reason).inc()


class _Refusal(Exception):
    """A refusal before any reply byte: its error answer, and the code the access line names."""

    def __init__(self, status: int, message: str, code: str, *, param: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        self.code = code
        self.response = error_response(status, message, code, param=param, headers=headers)


def _usage_null(chunk: dict[str, Any], asked: bool) -> dict[str, Any]:
    """A chunk before the usage one, as OpenAI streams it when the usage is asked: ``"usage": null``."""
    if asked:
        chunk["usage"] = None
    return chunk


async def _json(request: HttpRequest) -> Any:
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > MAX_BODY:  # stop reading: a prompt this large is no prompt
            raise _Refusal(413, f"the body is over {MAX_BODY >> 20} MiB", "body_too_large")
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:  # ValueError: JSON's, and an integer of too many digits
        raise BadRequest(f"the body is not JSON: {error}") from None


def _latest_user_mark(service: Service, messages: Sequence[Mapping[str, object]],
                      kwargs: Mapping[str, object], ids: tuple[int, ...]) -> tuple[int, ...]:
    """Where the chat's latest user message starts in ``ids``, as a keep mark: the conversation before
    it, rendered and tokenized, when that is a prefix of ``ids`` (a template may render earlier turns
    differently once a later one follows; then no mark). None without a prompt cache."""
    template = service.loaded.template
    latest = max((i for i, message in enumerate(messages) if message.get("role") == "user"), default=0)
    if not service.engine.cache.enabled or latest == 0 or template is None:
        return ()
    try:
        before = template.render(list(messages[:latest]), add_generation_prompt=False, **kwargs)
    except ChatTemplateError:
        return ()
    head = service.loaded.tokenizer.encode(before, add_special_tokens=False).ids
    return (len(head),) if 0 < len(head) < len(ids) and ids[:len(head)] == tuple(head) else ()

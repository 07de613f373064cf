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

A chat's prompt is its template's rendering (``tfd.server.chat_prompt``: tools, the thinking
switch, keep marks); its reply's text is read into a message (thought, content, tool calls). The
choices' submission, their events and the resources a request holds are
``tfd.server.generation``'s.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tfd.engine.grammar import Grammar, GrammarError
from tfd.engine.request import Request
from tfd.model import GDN_CHUNK as CHUNK
from tfd.server.access import HEADER, Access, Exchange, exchange_of
from tfd.server.bad_request import BadRequest
from tfd.server.chat_prompt import Reading, chat_prompt, render
from tfd.server.description import description
from tfd.server.generation import RETRY_AFTER_S, Generation, Refusal, choices
from tfd.server.http import error_response
from tfd.server.lifecycle import Lifecycle
from tfd.server.metrics import Metrics
from tfd.server.replies import Api, Reply
from tfd.server.schema import Common, chat_body, check_bias, completion_body
from tfd.server.service import Service
from tfd.server.structured import grammar
from tfd.server.tool_grammar import tool_constraint

MAX_BODY = 32 << 20


@attrs.frozen
class Prompted:
    """What a generating route's body gives: the prompt's token ids, the common fields, the keep
    marks, and (chat) how the reply's text is read."""

    ids: tuple[int, ...]
    common: Common
    marks: tuple[int, ...] = ()
    reading: Reading | None = None
    grammar: tuple[str, str] | None = None  # the Lark grammar the reply must follow, the field it is from


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
        except Refusal as refusal:
            return refusal.response
        if self._description is None:
            self._description = description(service.loaded.model.cfg.vocab)
        return JSONResponse(self._description)

    async def chat(self, request: HttpRequest) -> Response:
        return await self._answer(request, "chat", self._chat_prompt)

    async def completions(self, request: HttpRequest) -> Response:
        return await self._answer(request, "completion", self._completion_prompt)

    async def _answer(self, http: HttpRequest, api: Api,
                      prompt: Callable[[HttpRequest, Service], Awaitable[Prompted]]) -> Response:
        """A generating route: the request's id first, then ``prompt`` read from the body and run;
        a refusal answers its error, its code noted for the access line."""
        exchange = exchange_of(http)
        try:
            current = self.service()
            self.access.assign(exchange, api, http.headers.get(HEADER),
                               lambda found: current is not None and current.engine.has(found))
            service = self._ready()
            prompted = await prompt(http, service)
            check_bias(prompted.common.sampling, service.loaded.model.cfg.vocab)
            return await self._generate(http, exchange, service, api, prompted)
        except Refusal as refusal:
            exchange.error = refusal.code
            return refusal.response
        except BadRequest as error:
            exchange.error = error.code
            return error_response(400, str(error), error.code, param=error.param)

    async def _chat_prompt(self, http: HttpRequest, service: Service) -> Prompted:
        body = chat_body(await _json(http))
        self._check_model(service, body.common.model)
        template = service.loaded.template
        if template is None:
            raise BadRequest("this model has no chat template; use /v1/completions", "messages")
        found = chat_prompt(body, template, service.loaded.tokenizer, service.engine.cache.enabled)
        reading, constraint, special = found.reading, body.common.constraint, service.vocabulary.special
        calls = None
        if reading.tools is not None and reading.tool_format is not None:
            if reading.tools.forced and constraint is not None:
                raise BadRequest(f"{constraint.field} cannot be combined with tool_choice "
                                 f"{reading.tools.choice}: the reply is the calls", constraint.field)
            calls = tool_constraint(reading.tools, reading.tool_format, special, constraint)
        constraint = calls or constraint
        rules = None if constraint is None else \
            (grammar(constraint, bool(reading.inside), special), constraint.field)
        return Prompted(found.ids, body.common, found.marks, reading, rules)

    async def _completion_prompt(self, http: HttpRequest, service: Service) -> Prompted:
        body = completion_body(await _json(http))
        self._check_model(service, body.common.model)
        constraint = body.common.constraint
        rules = None if constraint is None else \
            (grammar(constraint, False, service.vocabulary.special), constraint.field)
        if isinstance(body.prompt, str):
            ids = tuple(service.loaded.tokenizer.encode(body.prompt, add_special_tokens=False).ids)
            return Prompted(ids, body.common, grammar=rules)
        vocab = service.loaded.model.cfg.vocab
        if max(body.prompt) >= vocab:
            raise BadRequest(f"prompt holds token ids past the vocabulary of {vocab}", "prompt")
        return Prompted(body.prompt, body.common, grammar=rules)

    async def models(self, request: HttpRequest) -> Response:
        try:
            service = self._ready()
        except Refusal as refusal:
            return refusal.response
        return JSONResponse({"object": "list", "data": [self._model_entry(service)]})

    async def model(self, request: HttpRequest) -> Response:
        """``/v1/models/{model}``: the served model's entry, or 404 for another name."""
        try:
            service = self._ready()
            self._check_model(service, request.path_params["model"])
        except Refusal as refusal:
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
            tokenizer = service.loaded.tokenizer
            if "messages" in body:
                chat = chat_body(body)
                template = service.loaded.template
                if template is None:
                    raise BadRequest("this model has no chat template", "messages")
                add = body.get("add_generation_prompt", True)
                if not isinstance(add, bool):
                    raise BadRequest("add_generation_prompt must be a boolean", "add_generation_prompt")
                if add:  # as the chat route renders it: tools and the thinking switch too
                    ids = list(chat_prompt(chat, template, tokenizer, False).ids)
                else:
                    text = render(template, list(chat.messages), False, chat.template_kwargs)
                    ids = tokenizer.encode(text, add_special_tokens=False).ids
            elif isinstance(body.get("prompt"), str):
                ids = tokenizer.encode(body["prompt"], add_special_tokens=False).ids
            else:
                raise BadRequest("give prompt (a string) or messages", "prompt")
        except Refusal as refusal:
            return refusal.response
        except BadRequest as error:
            return error_response(400, str(error), error.code, param=error.param)
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
        except Refusal as refusal:
            return refusal.response
        except BadRequest as error:
            return error_response(400, str(error), error.code, param=error.param)
        return JSONResponse({"prompt": service.loaded.tokenizer.decode(tokens, skip_special_tokens=False)})

    def _ready(self) -> Service:
        service = self.service()
        if service is None or not self.lifecycle.admitting:
            state = self.lifecycle.phase.value
            raise Refusal(503, f"the server is {state}; try again later", state,
                           headers={"Retry-After": RETRY_AFTER_S})
        return service

    @staticmethod
    def _check_model(service: Service, model: str | None) -> None:
        if model is not None and model != service.name:
            raise Refusal(404, f"the model {model} does not exist; this server serves {service.name}",
                           "model_not_found", param="model")

    async def _generate(self, http: HttpRequest, exchange: Exchange, service: Service, api: Api,
                        prompted: Prompted) -> Response:
        ids, common = prompted.ids, prompted.common
        if not ids:
            raise BadRequest("the prompt has no tokens", "prompt" if api == "completion" else "messages")
        assert exchange.id is not None  # _answer gave it
        exchange.prompt = len(ids)
        context = service.engine.limits.context
        max_tokens = common.max_tokens if common.max_tokens is not None else max(context - len(ids), 1)
        stop_ids = () if common.ignore_eos else service.loaded.eos_ids
        compiled = None if prompted.grammar is None else await _compile(service, common, *prompted.grammar)
        # arrived is when the HTTP request came: the time to first token counts reading and tokenizing
        request = Request(exchange.id, ids, max_tokens, common.sampling, common.stop, stop_ids,
                          arrived=exchange.started, draft=common.draft, keep_at=prompted.marks,
                          cache=common.cache, min_tokens=common.min_tokens, grammar=compiled)
        reply = Reply(api, exchange.id, service.name, ids, service.loaded.tokenizer, common.return_token_ids,
                      prompted.reading, common.n)
        generation = Generation(self.lifecycle, self.metrics, service, exchange, reply)
        queue = service.engine.limits.queue
        if common.n > max(queue, 1):
            raise BadRequest(f"n: {common.n} choices wait for admission together; this server queues {queue} "
                             f"requests at most", "n")
        shared = common.cache and service.engine.cache.enabled and len(ids) > CHUNK
        generation.submit(choices(request, common.n, shared))
        if common.stream:
            return generation.stream(common.include_usage)
        finished, _ = await generation.whole(http)
        failed = next((done for done in finished if done.reason == "failed"), None)
        if failed is not None:
            exchange.error = "server_error"
            return error_response(500, failed.message or "the request failed", "server_error")
        return JSONResponse(reply.whole(finished))


async def _json(request: HttpRequest) -> Any:
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > MAX_BODY:  # stop reading: a prompt this large is no prompt
            raise Refusal(413, f"the body is over {MAX_BODY >> 20} MiB", "body_too_large")
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:  # ValueError: JSON's, and an integer of too many digits
        raise BadRequest(f"the body is not JSON: {error}") from None


async def _compile(service: Service, common: Common, lark: str, field: str) -> Grammar:
    """The reply's grammar compiled (off the trio thread: milliseconds, more for a large schema);
    ``BadRequest`` naming ``field`` when it does not compile, or names what a grammar's end excludes."""
    for name, value in (("min_tokens", common.min_tokens), ("ignore_eos", common.ignore_eos)):
        if value:
            raise BadRequest(f"{name} cannot be used with {field}: the grammar decides where the reply ends",
                             name)
    try:
        return await trio.to_thread.run_sync(service.vocabulary.compile, lark, common.n)
    except GrammarError as error:
        raise BadRequest(f"{field}: the grammar it asks for does not compile: {error}", field) from None

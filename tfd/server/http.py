"""The HTTP application: /health, /metrics, API keys, JSON errors, request counters, the access log.

``build_app`` returns an ASGI app for hypercorn. Every answer, errors included, is JSON in OpenAI's
error shape (``{"error": {"message", "type", "param", "code"}}``) except /metrics, which is
Prometheus text. /health stays open when API keys are set; every other route needs a key. Every
request gets an access line when it ends (``tfd.server.access``); an answer to a request that got
an id carries it in ``x-request-id``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence

import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tfd import __version__
from tfd.server.access import HEADER, Access, exchange_of, logged_path
from tfd.server.lifecycle import Lifecycle, Phase
from tfd.server.metrics import CONTENT_TYPE, Metrics

log = logging.getLogger("tfd.http")
OPEN_PATHS = frozenset({"/health"})
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                405: "invalid_request_error", 413: "invalid_request_error", 503: "service_unavailable"}


def error_response(status: int, message: str, code: str, *, param: str | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    """An error answer in OpenAI's shape."""
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


class ClosedStream(StreamingResponse):
    """A streamed answer whose generator is closed before the answer returns, however it ends.

    Resource handling: when the client goes away while the generator waits at a ``yield`` (its
    chunk being sent), starlette drops it unclosed and its ``finally`` (cancel the lane, end the
    work, say how the request finished) would run whenever the garbage collector finalized it,
    after the access line was written. Here it runs first, shielded from the cancellation that
    ended the answer.
    """

    def __init__(self, content: AsyncGenerator[bytes, None], **kwargs: object) -> None:
        super().__init__(content, **kwargs)  # type: ignore[arg-type]
        self.generator = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with trio.CancelScope(shield=True):
                await self.generator.aclose()


def build_app(lifecycle: Lifecycle, metrics: Metrics, api_keys: Sequence[str] = (),
              routes: Iterable[BaseRoute] = (),
              details: Callable[[], Mapping[str, object]] | None = None,
              access: Access | None = None) -> ASGIApp:
    """The ASGI app: our routes plus ``routes``, behind the key check, the counters and the access
    log (``access``: the routes' own, to share its ids; None: a fresh one). ``details`` adds to
    /health's body (the model, its lanes)."""

    async def health(request: Request) -> JSONResponse:
        body: dict[str, object] = {"state": lifecycle.phase.value, "uptime_s": round(lifecycle.uptime, 3),
                                   "version": __version__}
        if details is not None:
            body.update(details())
        # Load balancers read the status: only a ready daemon takes traffic.
        return JSONResponse(body, status_code=200 if lifecycle.phase is Phase.READY else 503)

    async def metrics_text(request: Request) -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        exchange_of(request).error = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code,
                                                                                         "http_error")
        if exc.status_code == 404:
            return error_response(404, f"no route {request.url.path}", "not_found")
        if exc.status_code == 405:
            return error_response(405, f"{request.method} is not allowed on {request.url.path}",
                                  "method_not_allowed", headers=exc.headers)
        return error_response(exc.status_code, str(exc.detail), "http_error", headers=exc.headers)

    async def internal_error(request: Request, exc: Exception) -> Response:
        # the answer is JSON too; the traceback goes to the log (starlette raises it on after this)
        log.error("%s %s failed: %r", request.method, request.url.path, exc)
        exchange_of(request).error = "internal_error"
        return error_response(500, f"internal error ({type(exc).__name__}); the server's log has the details",
                              "internal_error")

    all_routes = [Route("/health", health, methods=["GET"]),
                  Route("/metrics", metrics_text, methods=["GET"]), *routes]
    app = Starlette(routes=all_routes,
                    exception_handlers={HTTPException: http_error, Exception: internal_error})
    paths = frozenset(route.path for route in all_routes if isinstance(route, Route))
    return Gate(app, metrics, api_keys, paths, access if access is not None else Access())


class Gate:
    """ASGI middleware: refuses callers without a key, counts and times every answer, adds the
    request id header, and closes each request's access line once its app returned (a stream's
    generator has ended by then: it runs inside the app)."""

    def __init__(self, app: ASGIApp, metrics: Metrics, api_keys: Sequence[str],
                 paths: frozenset[str], access: Access) -> None:
        self.app = app
        self.metrics = metrics
        self.paths = paths
        self.access = access
        # Compare digests, in constant time, so neither length nor prefix of a key leaks.
        self.digests = tuple(hashlib.sha256(key.encode()).digest() for key in api_keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = path if path in self.paths else "unmatched"
        method = scope["method"] if scope["method"] in _METHODS else "other"
        status = 500
        started = time.perf_counter()
        scope, exchange = self.access.open(scope, path if path in self.paths else logged_path(scope))

        async def counted_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = exchange.status = message["status"]
                if exchange.id is not None:
                    message = {**message, "headers": [*message.get("headers", ()),
                                                      (HEADER.encode(), exchange.id.encode())]}
            await send(message)

        self.metrics.in_flight.inc()
        try:
            if self.digests and path not in OPEN_PATHS and not self._authorized(scope):
                self.metrics.refused.labels("api_key").inc()
                exchange.error = "invalid_api_key"
                answer = error_response(401, "a valid API key is required (Authorization: Bearer KEY)",
                                        "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                await answer(scope, receive, counted_send)
            else:
                await self.app(scope, receive, counted_send)
        finally:
            self.metrics.in_flight.dec()
            self.metrics.requests.labels(route, method, str(status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - started)
            self.access.close(exchange)

    def _authorized(self, scope: Scope) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, key = header.partition(b" ")
        if scheme.lower() != b"bearer" or not key:
            return False
        digest = hashlib.sha256(key.strip()).digest()
        return any([hmac.compare_digest(digest, known) for known in self.digests])

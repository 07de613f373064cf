"""Request ids and the access log: one id a generating request, one line a finished HTTP request.

A generating request's id is ``chatcmpl-<base>`` (chat) or ``cmpl-<base>`` (completions): the
engine's request id, the reply's ``id`` (whole and streamed), the ``request`` that admin ``lanes``
shows and admin ``cancel`` takes, the ``x-request-id`` response header and the access line's ``id``.
The base is the client's ``x-request-id`` when it sends one (1 to 128 letters, digits and
``-_.:/+=@~``; anything else is refused 400 naming the header), else a fresh uuid4 hex. While a
request of an id is live (from its arrival to its last byte, or in the engine), another that would
get it gets ``-2`` (``-3``, ...) after it instead: the engine cancels by id, so no two share one.

The access log: the ``tfd.access`` logger writes one line per HTTP request when it ends, whole,
streamed, refused, cancelled or left by its client, as logfmt: ``id method route status``, for a
generating route ``prompt cached completion ttft_s``, then ``total_s``, and ``finish``, ``error``
and ``client`` where known. Lines are INFO, but /health and /metrics (which probes and scrapers
poll every few seconds) log at DEBUG. TF_ACCESS_LOG=0 turns the lines off; ids and the header stay.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import Literal

import attrs
from starlette.requests import HTTPConnection
from starlette.types import Scope

from tfd.engine.request import Admitted, Emitted, Event, Finished
from tfd.server.bad_request import BadRequest

log = logging.getLogger("tfd.access")
HEADER = "x-request-id"
CLIENT_ID = re.compile(r"[A-Za-z0-9._:/+=@~-]{1,128}")
PREFIXES = {"chat": "chatcmpl-", "completion": "cmpl-"}
QUIET_ROUTES = frozenset({"/health", "/metrics"})
_STATE_KEY = "tfd.exchange"
_MAX_PATH = 200  # bytes of an unmatched path kept in its line


@attrs.define
class Exchange:
    """One HTTP request as its access line tells it: the gate fills in the status, a generating route
    the id, the tokens and how it finished (from the engine's events)."""

    method: str
    route: str
    client: str | None = None
    started: float = attrs.field(factory=time.monotonic)  # monotonic, when the request arrived
    generating: bool = False
    id: str | None = None
    status: int = 500  # what the app answered (500 until it answers)
    prompt: int | None = None
    cached: int | None = None
    completion: int | None = None
    ttft: float | None = None
    finish: str | None = None
    error: str | None = None  # the error code answered

    def another(self, finished: Finished) -> None:
        """A choice after the first ended: its tokens count with the request's (read after the
        first's end)."""
        self.completion = (self.completion or 0) + len(finished.tokens)

    def saw(self, event: Event) -> None:
        """Count an engine event of this request."""
        if isinstance(event, Admitted):
            self.cached = event.cached_tokens
        elif isinstance(event, Emitted):
            self.completion = (self.completion or 0) + len(event.tokens)
            if self.ttft is None and event.tokens:
                self.ttft = time.monotonic() - self.started
        elif isinstance(event, Finished):
            self.cached = event.cached_tokens
            self.completion = len(event.tokens)
            self.ttft = event.time_to_first_token if event.time_to_first_token is not None else self.ttft
            self.finish = event.reason

    def line(self, ended: float) -> str:
        fields: list[tuple[str, object]] = [("id", self.id or "-"), ("method", self.method),
                                            ("route", self.route), ("status", self.status)]
        if self.generating:
            fields += [("prompt", _or_dash(self.prompt)), ("cached", _or_dash(self.cached)),
                       ("completion", _or_dash(self.completion)),
                       ("ttft_s", "-" if self.ttft is None else f"{self.ttft:.3f}")]
        fields.append(("total_s", f"{ended - self.started:.3f}"))
        fields += [(key, value) for key, value in (("finish", self.finish), ("error", self.error),
                                                   ("client", self.client)) if value is not None]
        return " ".join(f"{key}={value}" for key, value in fields)


class Access:
    """The daemon's request ids and access log (trio thread only).

    Resource handling: an id taken by ``assign`` is held until ``close`` of its exchange.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._live: set[str] = set()

    def open(self, scope: Scope, route: str) -> tuple[Scope, Exchange]:
        """A new exchange for an HTTP request, and the scope that carries it to the routes."""
        client = scope.get("client")
        exchange = Exchange(scope["method"], route, _address(client) if client else None)
        return {**scope, "state": {**scope.get("state", {}), _STATE_KEY: exchange}}, exchange

    def assign(self, exchange: Exchange, api: Literal["chat", "completion"], header: str | None,
               taken: Callable[[str], bool] = lambda _: False) -> str:
        """Give ``exchange`` its request id (module docstring) and hold it; ``taken`` says which
        ids the engine still runs. Raises ``BadRequest`` (param ``x-request-id``) for a malformed
        client id."""
        exchange.generating = True
        if header is not None and not CLIENT_ID.fullmatch(header):
            raise BadRequest(f"the {HEADER} header must be 1 to 128 letters, digits and -_.:/+=@~",
                             HEADER, "invalid_request_id")
        base = PREFIXES[api] + (header if header is not None else uuid.uuid4().hex)
        found, n = base, 1
        while found in self._live or taken(found):
            n += 1
            found = f"{base}-{n}"
        self._live.add(found)
        exchange.id = found
        return found

    def close(self, exchange: Exchange) -> None:
        """The exchange is over: its id is let go, and its line written (unless turned off)."""
        if exchange.id is not None:
            self._live.discard(exchange.id)
        if self.enabled:
            level = logging.DEBUG if exchange.route in QUIET_ROUTES else logging.INFO
            log.log(level, "%s", exchange.line(time.monotonic()))


def exchange_of(http: HTTPConnection) -> Exchange:
    """The exchange ``Access.open`` gave this request; a detached one where none did (an app
    served without the gate)."""
    found = http.scope.get("state", {}).get(_STATE_KEY)
    if isinstance(found, Exchange):
        return found
    return Exchange(http.scope.get("method", "-"), http.scope.get("path", "-"))


def logged_path(scope: Scope) -> str:
    """The raw path as a log field: printable ASCII kept, anything else (spaces, quotes, control
    bytes, UTF-8) percent-encoded, so no path can forge a field or a line; cut at 200 bytes."""
    raw = scope.get("raw_path") or scope["path"].encode()
    return "".join(chr(b) if 0x21 <= b <= 0x7E and b not in b'"\\' else f"%{b:02X}"
                   for b in raw[:_MAX_PATH])


def _address(client: tuple[str, int] | list[object]) -> str:
    host, port = client[0], client[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def _or_dash(value: int | None) -> object:
    return "-" if value is None else value

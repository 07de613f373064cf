"""The conformance kit's view of a live server: its OpenAI API over HTTP and its admin socket.

Plain blocking calls (``http.client``, one connection a call) so that gates run requests side by
side from threads, as separate clients would. ``leave`` opens a streaming request and drops the
connection at a chosen moment, as a client that goes away does.

Error handling: a server that does not answer raises ``OSError`` (refused, reset, timed out); an
answer that is not JSON where JSON is due raises ``ValueError``; HTTP errors are answers (their
status and body are returned), since refusals are what some gates check.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from tfd.server.admin import call


@attrs.frozen
class Answer:
    status: int
    body: dict[str, Any]


class Client:
    """``url`` (http://host:port), its API key if it wants one, and its admin socket if given."""

    def __init__(self, url: str, api_key: str | None = None, admin: Path | None = None,
                 timeout: float = 300.0) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"--url must be http://host:port, not {url!r}")
        self.host, self.port = parsed.hostname, parsed.port or 80
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.admin_path = admin
        self.timeout = timeout

    def post(self, path: str, body: object, raw: bytes | None = None) -> Answer:
        """POST ``body`` as JSON (or ``raw`` bytes) to ``path``; the status and the JSON answer."""
        status, data = self._exchange("POST", path, raw if raw is not None else json.dumps(body).encode())
        try:
            answer = json.loads(data)
        except ValueError:
            raise ValueError(f"POST {path} answered {status} with no JSON: {data[:120]!r}") from None
        return Answer(status, answer if isinstance(answer, dict) else {"answer": answer})

    def get(self, path: str) -> Answer:
        status, data = self._exchange("GET", path, None)
        try:
            return Answer(status, json.loads(data))
        except ValueError:
            return Answer(status, {"text": data.decode(errors="replace")})

    def _exchange(self, method: str, path: str, payload: bytes | None) -> tuple[int, bytes]:
        """One request on a connection of its own: the status and the whole body."""
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            connection.request(method, path, payload, self.headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def stream(self, path: str, body: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
        """Stream ``body`` to its end: the status and every event's JSON (``[DONE]`` left out; an
        answer that is not a stream comes back as one event, its JSON). ``ValueError`` when a
        stream ends without ``[DONE]``."""
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            connection.request("POST", path, json.dumps({**body, "stream": True}).encode(), self.headers)
            response = connection.getresponse()
            if not response.getheader("Content-Type", "").startswith("text/event-stream"):
                return response.status, [json.loads(response.read())]
            events, done = [], False
            while line := response.readline():
                if line.startswith(b"data: "):
                    data = line.removeprefix(b"data: ").strip()
                    done = data == b"[DONE]"
                    if not done:
                        events.append(json.loads(data))
            if not done:
                raise ValueError(f"POST {path}: the stream ended without [DONE]")
            return response.status, events
        finally:
            connection.close()

    def leave(self, path: str, body: dict[str, Any], after_chunks: int,
              before_leaving: Callable[[], None] | None = None) -> int:
        """Stream ``body`` and drop the connection once ``after_chunks`` chunks came (the first one
        comes as soon as the server has queued the request, before any token), calling
        ``before_leaving`` first; the chunks read."""
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            connection.request("POST", path, json.dumps({**body, "stream": True}).encode(), self.headers)
            response = connection.getresponse()
            chunks = 0
            while chunks < after_chunks:
                line = response.readline()
                if not line:
                    break
                chunks += line.startswith(b"data: ")
            if before_leaving is not None:
                before_leaving()
            return chunks
        finally:
            connection.close()  # the client is gone

    def admin(self, command: str) -> dict[str, Any]:
        """An admin command's answer (``ValueError`` when the kit has no socket or it says no)."""
        if self.admin_path is None:
            raise ValueError(f"admin {command}: the kit was given no --admin socket")
        answer = call(self.admin_path, command)
        if answer.get("ok") is not True:
            raise ValueError(f"admin {command} answered {answer}")
        found = answer.get(command)
        return found if isinstance(found, dict) else {"value": found}

    def lanes(self) -> list[dict[str, Any]]:
        """Admin ``lanes``: each running or waiting request, its phase and position."""
        found = self.admin("lanes")["lanes"]
        assert isinstance(found, list)
        return found

    def census(self) -> dict[str, Any]:
        census = self.admin("pool")["census"]
        assert isinstance(census, dict)
        return census

    def settled(self, want: dict[str, Any], seconds: float) -> dict[str, Any]:
        """The census once it equals ``want``, or as it is after ``seconds`` (a cancel takes effect at
        the server's next step, a finished lane's pages come back after its last one)."""
        give_up = time.monotonic() + seconds
        while (now := self.census()) != want and time.monotonic() < give_up:
            time.sleep(0.1)
        return now

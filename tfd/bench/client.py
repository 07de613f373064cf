"""The load generator's HTTP/1.1 client: trio streams, kept-alive connections, bodies fed as they come.

Small on purpose: one request at a time a connection, a JSON body with its length, and an answer
read whole or, for a stream, handed piece by piece to a sink with the moment its bytes arrived
(chunked, sized or to the end of the connection). No dependency beyond trio, and little work a
byte, so that 64 streams of a few hundred chunks a second each leave the client idle most of the
time.

Resource handling: a connection goes back to the ``Pool`` only after its answer was read to the
end and the server did not ask to close it; every other one (an error, a timeout, a cancelled
request) is closed at once, by the call that used it. A kept connection the server closed while
idle fails before any answer byte; such a request is sent once more on a fresh connection.

Error handling: everything that goes wrong on the wire is an ``ExchangeError`` with a short ``kind``
for the run's error table (``connect ConnectionRefusedError``, ``connection closed``, ``bad
response``); HTTP error statuses are answers, not errors.
"""

from __future__ import annotations

import ssl
import urllib.parse
from collections.abc import Callable

import attrs
import trio

MAX_HEAD = 64 << 10  # bytes of a status line or header block before the answer is refused as malformed
MAX_BODY = 64 << 20  # of a whole (not streamed) answer
RECEIVE = 1 << 16

Sink = Callable[[bytes, float], None]  # a body piece and when its last byte arrived (trio.current_time)


class ExchangeError(Exception):
    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


@attrs.frozen
class Target:
    """A server: ``http[s]://host[:port][/prefix]``, and the header lines every request carries."""

    host: str
    port: int
    tls: bool
    prefix: str
    headers: bytes

    @classmethod
    def parse(cls, url: str, api_key: str | None = None) -> Target:
        """``url`` read, or ``ValueError`` saying what a server URL looks like."""
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"a server is http://host:port, not {url!r}")
        try:
            port = parsed.port or (443 if parsed.scheme == "https" else 80)
        except ValueError:
            raise ValueError(f"{url!r}: the port is not a number from 0 to 65535") from None
        host = parsed.hostname
        authority = f"[{host}]" if ":" in host else host
        lines = [f"Host: {authority}:{port}", "User-Agent: tfd-bench", "Accept: */*"]
        if api_key:
            lines.append(f"Authorization: Bearer {api_key}")
        return cls(host, port, parsed.scheme == "https", parsed.path.rstrip("/"),
                   "".join(f"{line}\r\n" for line in lines).encode())

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}{self.prefix}"


@attrs.frozen
class Answer:
    status: int
    headers: dict[str, str]  # names lower case
    body: bytes  # empty when a sink took it


class Connection:
    """One open stream and what was read from it but not consumed yet."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buffer = bytearray()
        self.pos = 0  # where the unread bytes start
        self.arrived = 0.0  # trio.current_time() when the latest bytes came
        self.answered = False  # an answer byte came on this connection's current exchange

    async def receive(self) -> bool:
        """More bytes into the buffer; False at the end of the stream."""
        if self.pos and self.pos == len(self.buffer):
            self.buffer.clear()
            self.pos = 0
        elif self.pos > RECEIVE:  # drop what was read, now and then rather than each time
            del self.buffer[:self.pos]
            self.pos = 0
        data = await self.stream.receive_some(RECEIVE)
        self.arrived = trio.current_time()
        if not data:
            return False
        self.answered = True
        self.buffer += data
        return True

    async def line(self) -> bytes:
        """The next CRLF-ended line, without its end."""
        scanned = 0  # unread bytes already searched (less one: a CR may end them); receive() moves them
        while (end := self.buffer.find(b"\r\n", self.pos + scanned)) < 0:
            scanned = max(0, len(self.buffer) - self.pos - 1)
            if len(self.buffer) - self.pos > MAX_HEAD:
                raise ExchangeError("bad response", "a line over 64 KiB")
            if not await self.receive():
                raise ExchangeError("connection closed", "in the middle of the answer")
        found = bytes(self.buffer[self.pos:end])
        self.pos = end + 2
        return found

    async def take(self, size: int, sink: Sink | None, kept: bytearray) -> None:
        """``size`` bytes to ``sink`` (piece by piece, as they come) or onto ``kept``."""
        while size:
            if self.pos == len(self.buffer) and not await self.receive():
                raise ExchangeError("connection closed", "in the middle of the body")
            piece = bytes(self.buffer[self.pos:self.pos + size])
            self.pos += len(piece)
            size -= len(piece)
            _deliver(piece, self.arrived, sink, kept)

    async def chunked(self, sink: Sink | None, kept: bytearray) -> None:
        """A chunked body to its last chunk and trailers. Chunks already whole in the buffer (a stream's
        usual case: a server-sent event a chunk) are passed on without a coroutine call each."""
        buffer = self.buffer  # receive() changes it in place
        while True:
            if (end := buffer.find(b"\r\n", self.pos)) >= 0:
                size = _size(bytes(buffer[self.pos:end]), 16)
                if size == 0:
                    self.pos = end + 2
                    break
                stop = end + 2 + size
                if len(buffer) >= stop + 2:
                    if buffer[stop:stop + 2] != b"\r\n":
                        raise ExchangeError("bad response", "a chunk longer than its size")
                    _deliver(bytes(buffer[end + 2:stop]), self.arrived, sink, kept)
                    self.pos = stop + 2
                    continue
                self.pos = end + 2  # a chunk still coming: its pieces as they come
                await self.take(size, sink, kept)
                if await self.line():
                    raise ExchangeError("bad response", "a chunk longer than its size")
                continue
            if len(buffer) - self.pos > MAX_HEAD:
                raise ExchangeError("bad response", "a chunk size line over 64 KiB")
            if not await self.receive():
                raise ExchangeError("connection closed", "in the middle of the body")
        while await self.line():  # trailers
            pass

    async def rest(self, sink: Sink | None, kept: bytearray) -> None:
        """Everything until the server closes: a body without length or chunks."""
        while True:
            if self.pos < len(self.buffer):
                _deliver(bytes(self.buffer[self.pos:]), self.arrived, sink, kept)
                self.pos = len(self.buffer)
            if not await self.receive():
                return

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


def _deliver(piece: bytes, at: float, sink: Sink | None, kept: bytearray) -> None:
    if sink is not None:
        sink(piece, at)
        return
    kept += piece
    if len(kept) > MAX_BODY:
        raise ExchangeError("bad response", "a body over 64 MiB")


def _size(text: bytes, base: int) -> int:
    """A chunk size (hex, extensions after ``;``) or a Content-Length."""
    try:
        size = int(text.split(b";", 1)[0].strip(), base)
    except ValueError:
        size = -1
    if size < 0:
        raise ExchangeError("bad response", f"a body size of {text[:40]!r}")
    return size


class Events:
    """Server-sent events out of body pieces: ``on_event(data, at)`` for each event's data lines
    joined, ``at`` when the piece that completed it arrived. Fields other than ``data`` (comments,
    ``event``, ``id``, ``retry``) are skipped: the API sends none that matter here."""

    def __init__(self, on_event: Sink) -> None:
        self.on_event = on_event
        self.pending = b""  # a line not ended yet
        self.data: list[bytes] = []

    def feed(self, piece: bytes, at: float) -> None:
        if not self.pending and piece.startswith(b"data: ") and piece.endswith(b"\n\n") \
                and piece.count(b"\n") == 2:  # one whole event, one data line: what the API sends
            self.on_event(piece[6:-2], at)
            return
        lines = (self.pending + piece).split(b"\n")
        self.pending = lines.pop()
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self.data:
                    data, self.data = b"\n".join(self.data), []
                    self.on_event(data, at)
            elif line.startswith(b"data:"):
                self.data.append(line[6:] if line[5:6] == b" " else line[5:])


class Pool:
    """Kept-alive connections to one ``Target``, as many as requests run at once (no cap: the load
    generator's own concurrency is the cap)."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.idle: list[Connection] = []
        self.opened = 0

    async def connect(self) -> Connection:
        try:
            if self.target.tls:
                stream: trio.abc.Stream = await trio.open_ssl_over_tcp_stream(
                    self.target.host, self.target.port, ssl_context=ssl.create_default_context())
            else:
                stream = await trio.open_tcp_stream(self.target.host, self.target.port)
        except OSError as error:
            raise ExchangeError(f"connect {type(error).__name__}", str(error)) from None
        self.opened += 1
        return Connection(stream)

    async def exchange(self, method: str, path: str, payload: bytes | None = None,
                       sink: Sink | None = None) -> Answer:
        """Send one request and read its answer to the end: a 200's body goes to ``sink`` when one is
        given, any other body (an error's JSON) is returned whole."""
        fresh = not self.idle
        connection = self.idle.pop() if self.idle else await self.connect()
        try:
            try:
                answer, keep = await self._once(connection, method, path, payload, sink)
            except (ExchangeError, trio.BrokenResourceError, OSError):
                if fresh or connection.answered:
                    raise
                # a kept connection the server closed while it idled: nothing was answered, send again
                await connection.aclose()
                connection = await self.connect()
                answer, keep = await self._once(connection, method, path, payload, sink)
        except trio.BrokenResourceError as error:
            await connection.aclose()
            raise ExchangeError("connection broken", str(error.__cause__ or error)) from None
        except OSError as error:
            await connection.aclose()
            raise ExchangeError(f"connection {type(error).__name__}", str(error)) from None
        except BaseException:  # an ExchangeError, a timeout's cancellation: the connection is spent
            await connection.aclose()
            raise
        if keep:
            self.idle.append(connection)
        else:
            await connection.aclose()
        return answer

    async def _once(self, connection: Connection, method: str, path: str, payload: bytes | None,
                    sink: Sink | None) -> tuple[Answer, bool]:
        connection.answered = False
        body = payload or b""
        head = (f"{method} {self.target.prefix}{path} HTTP/1.1\r\n".encode() + self.target.headers
                + (b"Content-Type: application/json\r\n" if payload is not None else b"")
                + f"Content-Length: {len(body)}\r\n\r\n".encode())
        await connection.stream.send_all(head + body)
        status_line = await connection.line()
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ExchangeError("bad response", f"status line {status_line[:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        size = 0
        while line := await connection.line():
            size += len(line)
            if size > MAX_HEAD:
                raise ExchangeError("bad response", "headers over 64 KiB")
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        kept = bytearray()
        target = sink if status == 200 else None
        keep = parts[0] == b"HTTP/1.1" and headers.get("connection", "").lower() != "close"
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            pass
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            await connection.chunked(target, kept)
        elif "content-length" in headers:
            await connection.take(_size(headers["content-length"].encode(), 10), target, kept)
        else:
            await connection.rest(target, kept)
            keep = False
        return Answer(status, headers, bytes(kept)), keep

    async def aclose(self) -> None:
        while self.idle:
            await self.idle.pop().aclose()

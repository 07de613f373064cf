"""The admin socket: one JSON object per line in, one per line out, for the daemon's own uid.

Request: ``{"cmd": "status"}`` (``"args": [...]`` where a command takes some). Answer:
``{"ok": true, "status": {...}}`` or ``{"ok": false, "error": {"code": ..., "message": ...}}``.
The socket file is mode 0600 and every peer's uid is checked with SO_PEERCRED: only the daemon's
own uid and root are served; anyone else is answered ``forbidden``, logged and disconnected.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import stat
import struct
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import trio

log = logging.getLogger("tfd.admin")

Command = Callable[[Sequence[object]], Awaitable[dict[str, object]]]
MAX_LINE = 64 * 1024
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
# Where env/tfd.service's RuntimeDirectory= puts the socket; the client also looks there.
SERVICE_SOCKET = "/run/tfd/admin.sock"


class AdminError(Exception):
    """A command's refusal, answered as ``{"ok": false, "error": {code, message}}``."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)


def socket_path(explicit: str | None, environ: Mapping[str, str]) -> tuple[Path, bool]:
    """The admin socket's path, and whether its directory must be private to us.

    ``explicit`` is TF_ADMIN_SOCKET when set. Otherwise: systemd's ``$RUNTIME_DIRECTORY``, the
    session's ``$XDG_RUNTIME_DIR/tfd``, and last ``/tmp/tfd-UID``, the one shared place, whose
    directory must then be private.
    """
    if explicit:
        return Path(explicit), False
    if environ.get("RUNTIME_DIRECTORY"):  # systemd's RuntimeDirectory=; may list several
        return Path(environ["RUNTIME_DIRECTORY"].split(":")[0]) / "admin.sock", False
    if environ.get("XDG_RUNTIME_DIR"):
        return Path(environ["XDG_RUNTIME_DIR"]) / "tfd" / "admin.sock", False
    return Path(f"/tmp/tfd-{os.getuid()}") / "admin.sock", True


def prepare_socket_dir(path: Path, *, private: bool) -> None:
    """Create the socket's directory (0700 when new); a ``private`` one must be ours alone.

    The default path lies under /tmp when no runtime directory is given, where another user could
    plant the directory first: so a private directory that belongs to someone else, or that others
    may write, raises ``OSError`` naming it. An operator's explicit path is taken as given.
    """
    directory = path.parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise OSError(errno.ENOTDIR, f"{directory} is not a directory")
    if private and (info.st_uid != os.getuid() or info.st_mode & 0o077):
        raise OSError(errno.EPERM, f"{directory} must belong to uid {os.getuid()} with mode 0700")


def peer_uid(sock: trio.socket.SocketType) -> tuple[int, int]:
    """The (pid, uid) of the process at the other end of a Unix socket."""
    pid, uid, _gid = _PEERCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return pid, uid


async def serve_admin(
    path: Path,
    commands: Mapping[str, Command],
    *,
    private_dir: bool = False,
    task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``commands`` on a Unix socket at ``path`` until cancelled.

    Resource handling: binds ``path`` mode 0600 (a stale socket there is replaced; a live one,
    answered by another daemon, is refused with ``OSError``), and removes it when cancelled, if it
    is still the socket we bound. Error handling: a bad line is answered with an error object and
    the connection stays open; a peer of another uid is refused, logged and dropped.
    """
    prepare_socket_dir(path, private=private_dir)
    await _clear_stale(path)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        await sock.bind(os.fspath(path))
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    bound = os.stat(path).st_ino
    try:
        sock.listen(16)
        listener = trio.SocketListener(sock)
        task_status.started(path)
        await trio.serve_listeners(_handler(commands), [listener])
    finally:
        sock.close()
        try:
            if os.stat(path).st_ino == bound:
                os.unlink(path)
        except FileNotFoundError:
            pass


async def _clear_stale(path: Path) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise OSError(errno.EEXIST, f"{path} exists and is not a socket")
    try:
        probe = await trio.open_unix_socket(os.fspath(path))
    except OSError:
        os.unlink(path)  # nobody answers: left by a daemon that died
        return
    await probe.aclose()
    raise OSError(errno.EADDRINUSE, f"another daemon answers on {path}")


def _handler(commands: Mapping[str, Command]) -> Callable[[trio.SocketStream], Awaitable[None]]:
    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            pid, uid = peer_uid(stream.socket)
            if uid not in (os.getuid(), 0):
                log.warning("admin: refused a connection from uid %d (pid %d)", uid, pid)
                error = AdminError("forbidden", f"uid {uid} may not administer this daemon "
                                   f"(it runs as uid {os.getuid()})")
                await _send(stream, _failure(error))
                return
            buffer = b""
            while True:
                data = await stream.receive_some(MAX_LINE)
                if not data:
                    return
                buffer += data
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        await _send(stream, await _answer(commands, line))
                if len(buffer) > MAX_LINE:
                    await _send(stream, _failure(AdminError(
                        "line_too_long", f"a command line may hold at most {MAX_LINE} bytes")))
                    return
    return handle


async def _answer(commands: Mapping[str, Command], line: bytes) -> dict[str, object]:
    try:
        request = json.loads(line)
        if not isinstance(request, dict) or not isinstance(request.get("cmd"), str):
            raise AdminError("bad_request", 'a command is a JSON object like {"cmd": "status"}')
        name, args = request["cmd"], request.get("args", [])
        if not isinstance(args, list):
            raise AdminError("bad_request", "args must be a JSON array")
        if name not in commands:
            raise AdminError("unknown_command",
                             f"unknown command {name!r}; known: {', '.join(sorted(commands))}")
        return {"ok": True, name: await commands[name](args)}
    except json.JSONDecodeError as error:
        return _failure(AdminError("bad_json", f"not JSON: {error}"))
    except AdminError as error:
        return _failure(error)


def _failure(error: AdminError) -> dict[str, object]:
    return {"ok": False, "error": {"code": error.code, "message": str(error)}}


async def _send(stream: trio.SocketStream, answer: dict[str, object]) -> None:
    await stream.send_all(json.dumps(answer).encode() + b"\n")


def no_args(name: str, args: Sequence[object]) -> None:
    """Refuse arguments to a command that takes none."""
    if args:
        raise AdminError("bad_request", f"{name} takes no arguments, got {len(args)}")


def call(path: Path, command: str, args: Sequence[str] = (), timeout: float = 30.0) -> dict[str, object]:
    """Send one command to the daemon at ``path`` and return its answer (blocking; the client).

    Raises ``OSError`` when nobody answers, ``ValueError`` when the answer is not one JSON line.
    """
    request: dict[str, object] = {"cmd": command}
    if args:
        request["args"] = list(args)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(os.fspath(path))
        # A refused peer is answered and dropped at once: its answer is still there to read.
        with contextlib.suppress(BrokenPipeError):
            sock.sendall(json.dumps(request).encode() + b"\n")
        answer = b""
        while not answer.endswith(b"\n"):
            data = sock.recv(MAX_LINE)
            if not data:
                break
            answer += data
    reply = json.loads(answer)
    if not isinstance(reply, dict):
        raise ValueError(f"the daemon answered {answer[:80]!r}")
    return reply

"""Start the daemon in this process as `tfd serve` does, with a case of settings, and say how it ended.

A case is a demo and a few TF_* rows. ``start`` runs ``tfd.cli.main(["serve"])`` with them as the
whole TF_* environment; a watcher thread waits for READY=1 on a notify socket (as systemd does), sends
one chat, then ``drain`` through the admin socket. The outcome is one of: READY and the chat's answer
then exit 0; a configuration refusal (exit 2, stderr a ``tfd:`` refusal naming a row the case sets); or
anything else (another exit status, an exception out of ``main``), which the start test reports by the
case's name with the daemon's stderr and the traceback.

Resource handling: the sockets and directories live in a fresh directory removed after the case; the
watcher thread is joined before ``start`` returns. In process (not a ``tfd serve`` child) because a
start costs a second here against five for a process's imports, and so a test can plant a fault.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import socket
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path
from unittest import mock

import attrs
import httpx

from support import CACHE, clean_environ
from tfd.env_kinds import UNIX_PATH_MAX

# A start here takes about a second; the guard only keeps a hung start from hanging the suite.
READY_GUARD_S = 600.0
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}
# The codes a client may be answered with when the settings allow no reply to this chat.
SETTLED_REFUSALS = {"queue_full", "context_length_exceeded"}
_ROW = re.compile(r"\bTF_[A-Z0-9_]+")
# Placeholders a case's value may hold, filled per start (``_filled``).
WORKDIR = "{workdir}"
CHECKPOINT = "{checkpoint}"
FREE_PORT = "{free port}"


@attrs.frozen
class Case:
    """A start: the demo it serves and the rows set (as environment variables) beside it."""

    demo: str
    rows: Mapping[str, str]

    @property
    def name(self) -> str:
        return " ".join([f"TF_DEMO={self.demo}", *(f"{k}={v}" for k, v in self.rows.items())])


@attrs.frozen
class Outcome:
    """How a start ended: ``status`` is main's exit status (None: it raised ``error``)."""

    status: int | None
    stderr: str
    ready: bool
    answer: tuple[int, str] | None  # the chat's HTTP status and body
    error: str | None  # a traceback out of main, or the watcher's

    def problem(self, case: Case) -> str | None:
        """Why this outcome breaks the start contract for ``case``; None when it holds."""
        if self.error is not None:
            return f"raised instead of exiting:\n{self.error}"
        if "Traceback" in self.stderr:
            return "printed a traceback"
        if self.status == 2:
            if not self.stderr.startswith("tfd: ") or not set(_ROW.findall(self.stderr)) & case.rows.keys():
                return "exited 2 without naming a row the case sets"
            return None
        if self.status != 0 or not self.ready:
            return f"exited {self.status} ({'after' if self.ready else 'before'} READY)"
        if self.answer is None:
            return "READY, but the chat got no answer"
        code, body = self.answer
        if code == 200 and '"choices"' in body:
            return None
        if code in (400, 503) and any(f'"{name}"' in body for name in SETTLED_REFUSALS):
            return None
        return f"READY, but the chat was answered {code}: {body[:400]}"


def check(case: Case) -> None:
    """Start ``case``; fail naming it, with its stderr, when the start contract breaks."""
    outcome = start(case)
    problem = outcome.problem(case)
    assert problem is None, f"{case.name}: {problem}\n--- stderr ---\n{outcome.stderr[-4000:]}"


def start(case: Case) -> Outcome:
    """Run ``tfd serve`` in this process with ``case``'s rows; return how it ended."""
    from tfd.cli import main

    workdir = Path(tempfile.mkdtemp(prefix="tfd-s-", dir="/tmp"))
    try:
        with _notify_socket(workdir / "n.sock") as notify:
            environ = _environ(case, workdir, notify.getsockname())
            watcher = _Watcher(notify, Path(environ["TF_ADMIN_SOCKET"]), environ.get("TF_API_KEYS"))
            stderr = io.StringIO()
            status: int | None = None
            error: str | None = None
            with mock.patch.dict(os.environ, environ, clear=True), contextlib.redirect_stderr(stderr):
                watcher.start()
                try:
                    main(["serve"])
                except SystemExit as ended:
                    status = ended.code if isinstance(ended.code, int) else 1
                except BaseException:
                    error = traceback.format_exc()
                finally:
                    watcher.finish()
            if watcher.error is not None:
                error = (error or "") + f"the watcher failed:\n{watcher.error}"
            return Outcome(status, stderr.getvalue(), watcher.ready, watcher.answer, error)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _environ(case: Case, workdir: Path, notify_path: str) -> dict[str, str]:
    environ = clean_environ(TF_DEMO=case.demo, TF_ADMIN_SOCKET=str(workdir / "a.sock"),
                            TF_HTTP_SOCKET=str(workdir / "h.sock"), NOTIFY_SOCKET=notify_path,
                            XDG_STATE_HOME=str(workdir / "state"))
    if {"TF_HOST", "TF_PORT"} & case.rows.keys():
        del environ["TF_HTTP_SOCKET"]  # the case is about TCP
        environ.setdefault("TF_PORT", "0")
    for name, value in case.rows.items():
        environ[name] = _filled(value, case.demo, workdir)
    return environ


def _filled(value: str, demo: str, workdir: Path) -> str:
    """A case's value with its placeholders filled: ``{workdir}`` (a path there is cut to the longest
    a Unix socket takes), ``{checkpoint}`` (a tiny served checkpoint of the demo's family) and
    ``{free port}``."""
    if value == CHECKPOINT:
        import tiny_models

        from tfd.demo import DEMOS

        return str(tiny_models.save_served(DEMOS[demo][0], CACHE / "tiny"))
    if value == FREE_PORT:
        with socket.socket() as probe:  # the kernel's pick, above the ports that need root
            probe.bind(("127.0.0.1", 0))
            return str(probe.getsockname()[1])
    if value.startswith(f"{WORKDIR}/"):
        return (str(workdir) + value.removeprefix(WORKDIR))[:UNIX_PATH_MAX]
    return value


@contextlib.contextmanager
def _notify_socket(path: Path) -> Iterator[socket.socket]:
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        notify.bind(os.fspath(path))
        yield notify
    finally:
        notify.close()


class _Watcher(threading.Thread):
    """Waits for READY=1, sends the chat, then ``drain``; stops early once ``finish`` is called."""

    def __init__(self, notify: socket.socket, admin: Path, keys: str | None) -> None:
        super().__init__(name="start-watcher", daemon=True)
        self.notify = notify
        self.admin = admin
        self.headers = {"authorization": f"Bearer {keys.split(',')[0]}"} if keys else {}
        self.finished = threading.Event()
        self.ready = False
        self.answer: tuple[int, str] | None = None
        self.error: str | None = None

    def finish(self) -> None:
        self.finished.set()
        self.join()

    def run(self) -> None:
        try:
            if self._wait_ready():
                self.answer = self._chat()
                self._drain()
        except BaseException:
            self.error = traceback.format_exc()
            with contextlib.suppress(OSError, ValueError):
                self._drain()

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + READY_GUARD_S
        self.notify.settimeout(0.1)
        while not self.finished.is_set():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no READY=1 within {READY_GUARD_S}s")
            try:
                fields = self.notify.recv(4096).decode().split("\n")
            except TimeoutError:
                continue
            if "READY=1" in fields:
                self.ready = True
                return True
        return False

    def _chat(self) -> tuple[int, str]:
        from tfd.server.admin import call

        status = call(self.admin, "status")["status"]
        assert isinstance(status, dict)
        url = str(status["http"][0])
        transport = None
        if url.startswith("http://unix:"):
            transport = httpx.HTTPTransport(uds=url.removeprefix("http://unix:"))
            url = "http://tfd"
        with httpx.Client(transport=transport, timeout=READY_GUARD_S) as client:
            reply = client.post(url + "/v1/chat/completions", json=CHAT, headers=self.headers)
        return reply.status_code, reply.text

    def _drain(self) -> None:
        from tfd.server.admin import call

        call(self.admin, "drain")

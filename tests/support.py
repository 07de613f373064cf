"""Test support: a clean environment, `tfd` runs, and a real `tfd serve` process."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import trio

# Variables of the host (systemd's, a developer's shell) that would change what tfd does.
_HOST_ONLY = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "RUNTIME_DIRECTORY", "CACHE_DIRECTORY")
# The demo models are built once per machine for every test run (their directory names carry a
# digest of the recipe, so a changed recipe builds anew).
ROOT = Path(__file__).resolve().parent.parent  # the checkout
CACHE = Path(tempfile.gettempdir()) / f"tfd-test-cache-{os.getuid()}"


def clean_environ(**extra: str) -> dict[str, str]:
    """os.environ without any TF_* or systemd variable, plus the test cache and ``extra``."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TF_") and k not in _HOST_ONLY}
    environ["TF_CACHE_DIR"] = str(CACHE)
    environ.update(extra)
    return environ


def compiled_for_hopper(arguments: Sequence[str], cache: Path, path: Sequence[Path] = ()) -> dict[str, Any]:
    """The JSON a script that compiles kernels for Hopper prints (``python ARGUMENTS``), run in a process
    of its own without Triton's interpreter (under it ``@triton.jit`` makes interpreted functions,
    which do not compile), ``cache`` its Triton cache, ``path`` before its PYTHONPATH. The test is
    skipped where Triton's ptxas is not installed; a script that fails is a failure."""
    import pytest

    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(cache), TRITON_DEFAULT_FP_FUSION="1")
    if path:
        env["PYTHONPATH"] = os.pathsep.join([*map(str, path), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, *arguments], capture_output=True, text=True, env=env, check=False)
    if done.returncode and "ptxas" in done.stderr and "not found" in done.stderr:
        pytest.skip(f"Triton's ptxas is not installed here: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def run_tfd(*args: str, env: Mapping[str, str] | None = None, timeout: float = 30,
            user: int | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m tfd ARGS`` to completion."""
    return subprocess.run([sys.executable, "-m", "tfd", *args], env=dict(env or clean_environ()),
                          capture_output=True, text=True, timeout=timeout, user=user)


class ServedDaemon:
    """A `tfd serve` subprocess with a fake systemd notify socket the test reads.

    ``start`` returns once READY=1 arrives; ``stop`` sends SIGTERM and waits. The log goes to a
    file, shown when a test fails.
    """

    def __init__(self, workdir: Path, **env: str) -> None:
        self.workdir = workdir
        self.admin = workdir / "admin.sock"
        self.notify_path = workdir / "notify.sock"
        self.log_path = workdir / "daemon.log"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(os.fspath(self.notify_path))
        self.env = clean_environ(TF_ADMIN_SOCKET=os.fspath(self.admin), TF_PORT="0",
                                 NOTIFY_SOCKET=os.fspath(self.notify_path), **env)
        self.messages: list[tuple[float, str]] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self._url: str | None = None

    def start(self, timeout: float = 30, command: Sequence[str] = (sys.executable, "-m", "tfd"),
              cwd: Path | None = None) -> ServedDaemon:
        """Run ``command serve`` (by default ``python -m tfd``; from ``cwd``, by default this one)."""
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([*command, "serve"], env=self.env, cwd=cwd,
                                         stdout=log, stderr=subprocess.STDOUT)
        self.wait_for("READY=1", timeout)
        return self

    def receive(self, timeout: float) -> list[str] | None:
        """The fields of the next notify datagram, or None after ``timeout``."""
        self.notify.settimeout(timeout)
        try:
            data = self.notify.recv(4096)
        except TimeoutError:
            return None
        fields = data.decode().split("\n")
        self.messages += [(time.monotonic(), field) for field in fields]
        return fields

    def wait_for(self, field: str, timeout: float) -> float:
        """Wait for a notify field; return when it arrived. Fails when the daemon exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}:\n{self.log()}")
            fields = self.receive(min(0.2, max(0.01, deadline - time.monotonic())))
            if fields and field in fields:
                return self.messages[-1][0]
        raise AssertionError(f"no {field} within {timeout}s:\n{self.log()}")

    def admin_call(self, command: str) -> dict[str, object]:
        return self.admin_call_args(command, [])

    def admin_call_args(self, command: str, args: list[str]) -> dict[str, object]:
        from tfd.server.admin import call

        return call(self.admin, command, args)

    def url(self) -> str:
        if self._url is None:
            status = self.admin_call("status")["status"]
            assert isinstance(status, dict)
            self._url = str(status["http"][0])
        return self._url

    def get(self, path: str, **kwargs: object) -> httpx.Response:
        return httpx.get(self.url() + path, timeout=10, **kwargs)  # type: ignore[arg-type]

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 30) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.notify.close()



@contextlib.contextmanager
def tiny_server(family: str = "qwen3_5", head: bool = False, **env: str) -> Iterator[ServedDaemon]:
    """A started `tfd serve` of the tiny served checkpoint of ``family`` (``head``: with a random
    MTP head, so it drafts), as ``started_server``."""
    import tiny_models  # torch-heavy: only tests that serve a model pay for it

    model = tiny_models.save_served(family, CACHE / ("tiny-head" if head else "tiny"), head=head)
    with started_server(TF_MODEL=str(model), **env) as daemon:
        yield daemon


@contextlib.contextmanager
def started_server(**env: str) -> Iterator[ServedDaemon]:
    """A started `tfd serve` with ``env`` (the demo model unless it names another) in a fresh
    directory; stopped and the directory removed on the way out."""
    workdir = Path(tempfile.mkdtemp(prefix="tfd-", dir="/tmp"))
    daemon = ServedDaemon(workdir, **env)
    try:
        yield daemon.start(timeout=120)
    finally:
        daemon.close()
        shutil.rmtree(workdir, ignore_errors=True)


def admin_json(text: str) -> dict[str, object]:
    answer = json.loads(text)
    assert isinstance(answer, dict)
    return answer


class InProcessDaemon:
    """Run a ``Daemon`` inside the test's trio run; ``done`` is set when ``run`` returns."""

    def __init__(self, workdir: Path, **env: str) -> None:
        import trio

        from tfd.env import FAMILY_SCOPES, Table
        from tfd.server.daemon import Daemon

        environ = {"TF_PORT": "0", "TF_ADMIN_SOCKET": str(workdir / "admin.sock"), "TF_CACHE_DIR": str(CACHE),
                   **env}
        settings = Table.load().read(environ, families=FAMILY_SCOPES)
        self.daemon = Daemon(settings, environ={})
        self.done = trio.Event()
        self.status: int | None = None

    async def run(self, *, task_status: object) -> None:
        try:
            self.status = await self.daemon.run(task_status=task_status)  # type: ignore[arg-type]
        finally:
            self.done.set()

    @property
    def url(self) -> str:
        return self.daemon.binds[0]


def census(daemon: ServedDaemon) -> dict[str, Any]:
    answer = daemon.admin_call("pool")
    assert answer["ok"] is True
    return answer["pool"]["census"]  # type: ignore[index,no-any-return]


async def settled(daemon: ServedDaemon) -> dict[str, Any]:
    """The census once every lane has gone (cancels take effect at the next step)."""
    with trio.fail_after(20):
        while True:
            now = await trio.to_thread.run_sync(census, daemon)
            if not now["lanes"]:
                return now
            await trio.sleep(0.05)


async def walk_away(daemon: ServedDaemon, body: dict[str, Any], read: bytes, times: int = 1,
                    holding: trio.Event | None = None) -> None:
    """A client that sends ``body`` to /v1/completions, reads until ``read`` showed ``times``
    times, and hangs up; with ``holding``, it sets that and keeps the connection until cancelled."""
    address = daemon.url().removeprefix("http://")
    host, port = address.rsplit(":", 1)
    payload = json.dumps(body).encode()
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        head = f"POST /v1/completions HTTP/1.1\r\nHost: tfd\r\nContent-Type: application/json\r\n" \
            f"Content-Length: {len(payload)}\r\n\r\n"
        await stream.send_all(head.encode() + payload)
        seen = b""
        while seen.count(read) < times:
            data = await stream.receive_some(65536)
            assert data, f"the server closed first: {seen!r}"
            seen += data
        if holding is not None:
            holding.set()
            await trio.sleep_forever()

"""Test support: a clean environment, `tfd` runs, and a real `tfd serve` process."""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing
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
TFD = (sys.executable, "-m", "tfd")  # the command ServedDaemon runs `serve` with unless told another


@functools.cache
def forks() -> bool:
    """Whether daemons and runs are forked from ``FORKED``'s server, its preload torch and tfd: where
    CUDA is absent (the CPU's suite, whose time it saves). With CUDA each daemon and run starts in a
    fresh interpreter and the ranks' server preloads what it did, as a device's runs did."""
    import torch

    return not torch.cuda.is_available()


# Processes forked from a server that imported torch and tfd once: ServedDaemon's `tfd serve`
# (forked_tfd) and test_tensor_parallel's ranks (parallel_rank); a fresh interpreter's imports cost
# some 2.5 s of CPU a process. multiprocessing keeps one forkserver a process, so its preload is said
# here alone, and by modules a fresh interpreter finds: before 3.12.8 and 3.13.1 (CPython gh-117378)
# the forkserver imports them on its own sys.path, not this process's, so a module of tests/ fails
# there, silently (parallel_rank, which test_tensor_parallel named alone, never was), and is imported
# by each child instead, as forked_tfd and parallel_rank now are: cheaply, their imports being these.
FORKED = multiprocessing.get_context("forkserver")
FORKED.set_forkserver_preload([
    "tfd.cli", "tfd.server.daemon", "tfd.server.service",  # `tfd serve`'s, through its load
    "torch.distributed", "tfd.bench.workload", "tfd.engine.local_runner", "tfd.model.parallel",  # a rank's
] if forks() else ["parallel_rank"])


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
            user: int | None = None, forked: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``python -m tfd ARGS`` to completion; ``forked`` (where ``forks``): as ``python -m tfd`` runs
    it, in a process forked from ``FORKED``'s server (``forked_tfd``: no interpreter's imports), its
    output, exit status and timeout as ``subprocess.run`` gives them."""
    command = [sys.executable, "-m", "tfd", *args]
    environ = dict(env or clean_environ())
    if not (forked and forks()):
        return subprocess.run(command, env=environ, capture_output=True, text=True, timeout=timeout,
                              user=user)
    assert user is None, "a forked run keeps this process's user"
    with tempfile.TemporaryDirectory(prefix="tfd-run-", dir="/tmp") as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        process = Forked(list(args), environ, out, err)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise subprocess.TimeoutExpired(command, timeout, read(out), read(err)) from None
        return subprocess.CompletedProcess(command, code, read(out), read(err))


def read(path: Path) -> str:
    """A file's text as ``subprocess.run(text=True)`` reads a pipe (nothing where no file is)."""
    return path.read_text() if path.exists() else ""


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
        self.proc: subprocess.Popen[bytes] | Forked | None = None
        self._url: str | None = None

    def start(self, timeout: float = 30, command: Sequence[str] = TFD,
              cwd: Path | None = None, fresh: bool = False) -> ServedDaemon:
        """Run ``command serve`` (by default ``python -m tfd``; from ``cwd``, by default this one).
        The default runs as ``python -m tfd serve`` does, in a process forked from ``FORKED``'s
        server (``forked_tfd``) where ``forks``; another command or directory, or ``fresh``, in a fresh
        interpreter (its imports, and its teardown after main returns, part of what is run)."""
        with open(self.log_path, "wb") as log:
            if tuple(command) == TFD and cwd is None and not fresh and forks():
                self.proc = Forked(["serve"], self.env, self.log_path, self.log_path)
            else:
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
        """Wait for a notify field; return when it arrived. Fails when the daemon exits first, once
        what it sent before it exited is read (a drain with nothing running sends STOPPING=1 and
        exits within milliseconds)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            exited = self.proc is not None and self.proc.poll() is not None
            fields = self.receive(0.001 if exited else min(0.2, max(0.01, deadline - time.monotonic())))
            if fields and field in fields:
                return self.messages[-1][0]
            if exited and fields is None:  # its queued datagrams all read
                assert self.proc is not None
                raise AssertionError(f"daemon exited {self.proc.returncode}:\n{self.log()}")
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


def forked_main(argv: list[str], environ: dict[str, str], cwd: str, stdout: str, stderr: str) -> None:
    """``forked_tfd.main`` in a process of ``FORKED`` (imported there: its imports are preloaded)."""
    import forked_tfd

    forked_tfd.main(argv, environ, cwd, stdout, stderr)


class Forked:
    """``tfd ARGV`` started in a process of ``FORKED`` (``forked_main``) with ``environ`` as its whole
    environment, from this directory, its output appended to ``stdout`` and ``stderr``; held as the tests
    hold a ``subprocess.Popen``: its pid, ``poll``, ``wait``, ``send_signal``, ``kill`` and
    ``returncode`` (negative: the signal that ended it)."""

    def __init__(self, argv: list[str], environ: Mapping[str, str], stdout: Path, stderr: Path) -> None:
        self.args = ["tfd", *argv]
        self.process = FORKED.Process(target=forked_main, name=" ".join(self.args), daemon=True, args=(
            argv, dict(environ), os.getcwd(), str(stdout), str(stderr)))
        self.process.start()
        assert self.process.pid is not None
        self.pid: int = self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.process.exitcode

    def send_signal(self, signum: int) -> None:
        if self.process.exitcode is None:  # as Popen: never a pid that may be another's by now
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


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

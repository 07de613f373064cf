"""The daemon's trio main: sockets up, ready, drain on a signal or `drain`, sockets down.

Lifecycle: STATUS while starting; the admin socket and HTTP bound; READY=1 once both answer;
WATCHDOG=1 while heartbeats are fresh; on the first SIGTERM or SIGINT (or admin ``drain``) STOPPING=1,
no new work, running work waits up to TF_DRAIN_TIMEOUT_S, then exit status 0. A second signal
exits at once with 128 + its number.
"""

from __future__ import annotations

import logging
import os
import signal
import stat
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as serve_http

from tfd import __version__
from tfd.env import Settings
from tfd.loading import LoadProgress, reporting
from tfd.server.access import Access
from tfd.server.admin import AdminError, Command, no_args, serve_admin, socket_path
from tfd.server.http import build_app
from tfd.server.lifecycle import Lifecycle, Phase
from tfd.server.metrics import Metrics
from tfd.server.openai import OpenAI
from tfd.server.service import ENGINE_STALL_S, Service, prepare, resident_bytes
from tfd.server.systemd import Heartbeat, Heartbeats, keep_watchdog, notify, watchdog_interval
from tfd_kernels.runtime import compiled_variants, watch_compiles

log = logging.getLogger("tfd.daemon")
# After the drain, connections still open get this long to finish before they are cut.
HTTP_GRACE_S = 5.0


class Daemon:
    """One serving process. ``run`` is its whole life and returns the exit status.

    Resource handling: the admin socket and an HTTP Unix socket are removed on every exit path.
    Error handling: a socket that cannot be bound raises ``OSError`` out of ``run`` (inside an
    ExceptionGroup) before READY.
    """

    def __init__(self, settings: Settings, environ: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self.environ = os.environ if environ is None else environ
        self.lifecycle = Lifecycle()
        self.metrics = Metrics(self.lifecycle)
        self.heartbeats = Heartbeats()
        self.admin_path, self._admin_private = socket_path(
            settings.optional("TF_ADMIN_SOCKET", str), self.environ)
        self.http_socket = settings.optional("TF_HTTP_SOCKET", str)
        self.binds: list[str] = []
        self.exit_status = 0
        self._stop_http = trio.Event()
        self._http_done = trio.Event()
        self.service: Service | None = None
        self.access = Access(settings.value("TF_ACCESS_LOG", bool))

    def notify(self, *fields: str) -> None:
        notify(*fields, environ=self.environ)

    async def run(self, *, task_status: trio.TaskStatus[Daemon] = trio.TASK_STATUS_IGNORED) -> int:
        self.notify(f"STATUS=starting tfd {__version__}")
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self._watch_signals, nursery.cancel_scope)
                await nursery.start(partial(serve_admin, self.admin_path, self.commands(),
                                            private_dir=self._admin_private))
                self.binds = await nursery.start(self._serve_http)
                interval = watchdog_interval(self.environ)
                if interval:
                    nursery.start_soon(keep_watchdog, interval, self.heartbeats,
                                       partial(notify, environ=self.environ))
                await self._load()
                self.lifecycle.ready()
                if self.lifecycle.phase is Phase.READY:
                    log.info("ready: HTTP on %s, admin on %s", ", ".join(self.binds), self.admin_path)
                    self.notify("READY=1", f"STATUS=ready: HTTP on {', '.join(self.binds)}")
                task_status.started(self)
                await self.lifecycle.drain_requested.wait()
                await self._drain()
                nursery.cancel_scope.cancel()
        finally:
            self._remove_http_socket()
        log.info("stopped with exit status %d", self.exit_status)
        return self.exit_status

    async def _drain(self) -> None:
        timeout = self.settings.value("TF_DRAIN_TIMEOUT_S", float)
        reason = self.lifecycle.drain_reason
        log.info("draining (%s): %d running, waiting up to %gs", reason, self.lifecycle.running, timeout)
        self.notify("STOPPING=1", f"STATUS=draining ({reason})")
        with trio.move_on_after(timeout) as waited:
            await self.lifecycle.wait_idle()
        if waited.cancelled_caught:
            log.warning("drain timed out after %gs with %d still running; exiting anyway",
                        timeout, self.lifecycle.running)
        self._stop_http.set()
        await self._http_done.wait()
        if self.service is not None:
            await self.service.close()

    async def _load(self) -> None:
        """Weights, pool and engine, then the warm-up; STATUS says which."""
        self.notify("STATUS=loading the model")
        with reporting(self._loading):  # heard in the worker thread, which gets a copy of this context
            prepared = await trio.to_thread.run_sync(prepare, self.settings, self.environ)
        heartbeat = Heartbeat("engine", ENGINE_STALL_S)
        self.notify("STATUS=building the engine")
        # the engine's runner captures CUDA graphs as it is built: seconds, off the trio thread
        service = await trio.to_thread.run_sync(Service, prepared, heartbeat, self._engine_failed,
                                                self.metrics.on_step)
        self.heartbeats.add(heartbeat)
        service.start()
        self.service = service
        pool, engine = service.pool, service.engine
        self.metrics.watch(lambda: (pool.free, pool.pages - pool.free),
                           lambda: (engine.running, engine.waiting))
        kept = engine.cache.kept_counts
        if kept is not None:
            self.metrics.watch_kept(kept)
        service.check_learning_cache()
        self.notify(f"STATUS=warming up {service.name}")
        await service.warm_up()
        stored = engine.cache.store_counts if await service.learn(self.environ) is not None else None
        if stored is not None:
            self.metrics.watch_learned(stored)
        if watch_compiles():
            self.metrics.watch_compiles(compiled_variants, len(compiled_variants()))

    def _loading(self, progress: LoadProgress) -> None:
        self.notify(f"STATUS=loading weights: {progress.line()}")  # a datagram: safe from the loader's thread

    def _engine_failed(self, error: BaseException) -> None:
        log.error("the engine failed (%s): draining, then exiting with status 1", error)
        self.exit_status = 1
        self.lifecycle.request_drain("engine failed")

    def _health(self) -> dict[str, object]:
        service = self.service
        if service is None:
            return {}
        return {"model": service.name, "lanes": {"running": service.engine.running,
                                                 "waiting": service.engine.waiting}}

    async def _watch_signals(self, everything: trio.CancelScope, *,
                             task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            async for signum in signals:
                name = signal.Signals(signum).name
                if self.lifecycle.request_drain(name):
                    log.info("%s: stop admitting, drain, exit", name)
                    continue
                log.warning("%s during the drain: exiting at once", name)
                self.exit_status = 128 + signum
                everything.cancel()
                return

    async def _serve_http(self, *, task_status: trio.TaskStatus[list[str]]) -> None:
        config = Config()
        if self.http_socket:
            config.bind = [f"unix:{self.http_socket}"]
            config.umask = 0o117  # socket mode 0660: the daemon's user and group
        else:
            host = self.settings.value("TF_HOST", str)
            port = self.settings.value("TF_PORT", int)
            config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
        config.errorlog = logging.getLogger("tfd.http")
        config.accesslog = None  # tfd.access writes the lines: ids, tokens and times hypercorn cannot see
        config.graceful_timeout = HTTP_GRACE_S
        keys = self.settings.optional("TF_API_KEYS", tuple) or ()
        # starlette's and hypercorn's ASGI type aliases differ; the protocol is the same.
        openai = OpenAI(self.lifecycle, self.metrics, lambda: self.service, self.access)
        app: Any = build_app(self.lifecycle, self.metrics, keys, openai.routes(), self._health, self.access)
        try:
            await serve_http(app, config, shutdown_trigger=self._stop_http.wait,
                             task_status=task_status)
        except* OSError as group:
            first = _first_leaf(group)
            raise OSError(getattr(first, "errno", None),
                          f"cannot listen on {config.bind[0]}: {describe(first)}") from None
        finally:
            self._http_done.set()

    def _remove_http_socket(self) -> None:
        if not self.http_socket:
            return
        try:
            if stat.S_ISSOCK(os.lstat(self.http_socket).st_mode):
                os.unlink(self.http_socket)
        except FileNotFoundError:
            pass

    def commands(self) -> dict[str, Command]:
        """The admin commands this daemon answers."""

        async def status(args: Sequence[object]) -> dict[str, object]:
            no_args("status", args)
            memory = self.service.memory() if self.service is not None else {"rss_bytes": resident_bytes()}
            return {"state": self.lifecycle.phase.value, "version": __version__, "pid": os.getpid(),
                    "uptime_s": round(self.lifecycle.uptime, 3), "http": self.binds,
                    "admin": os.fspath(self.admin_path), "running": self.lifecycle.running, "memory": memory}

        async def settings(args: Sequence[object]) -> dict[str, object]:
            no_args("settings", args)
            return {"rows": self.settings.effective()}

        async def drain(args: Sequence[object]) -> dict[str, object]:
            no_args("drain", args)
            started = self.lifecycle.request_drain("admin drain")
            return {"started": started, "running": self.lifecycle.running,
                    "timeout_s": self.settings["TF_DRAIN_TIMEOUT_S"]}

        async def pool(args: Sequence[object]) -> dict[str, object]:
            no_args("pool", args)
            service = self._loaded()
            return {"report": service.report.as_dict(), "census": await service.census()}

        async def learn(args: Sequence[object]) -> dict[str, object]:
            no_args("learn", args)
            return await self._loaded().kept()

        async def evict(args: Sequence[object]) -> dict[str, object]:
            no_args("evict", args)
            return dict(await self._loaded().evict())

        async def lanes(args: Sequence[object]) -> dict[str, object]:
            no_args("lanes", args)
            return {"lanes": await self._loaded().lanes()}

        async def cancel(args: Sequence[object]) -> dict[str, object]:
            if len(args) != 1 or not isinstance(args[0], str):
                raise AdminError("bad_request", "cancel takes one argument: the request id")
            service = self._loaded()
            running = {lane["request"] for lane in await service.lanes()}
            if args[0] not in running:
                raise AdminError("not_found", f"no request {args[0]} is running or waiting")
            service.engine.cancel(args[0])
            return {"request": args[0]}

        # tfd.server.admin_commands lists these for `tfd admin -h` (tests/server/test_admin.py checks)
        return {"status": status, "settings": settings, "drain": drain, "pool": pool, "lanes": lanes,
                "cancel": cancel, "learn": learn, "evict": evict}

    def _loaded(self) -> Service:
        if self.service is None:
            raise AdminError("loading", "the model is still loading")
        return self.service


def describe(error: BaseException) -> str:
    """An OSError without its "[Errno N]" prefix, keeping the file it names."""
    if isinstance(error, OSError) and error.strerror and not error.filename:
        return error.strerror
    return str(error)


def _first_leaf(group: BaseException) -> BaseException:
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    return group

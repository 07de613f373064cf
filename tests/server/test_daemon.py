"""`tfd serve` as systemd runs it: notify, watchdog, SIGTERM, sockets cleaned up."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import httpx

from support import ServedDaemon, clean_environ, run_tfd


def test_systemd_lifecycle(served: type[ServedDaemon]) -> None:
    daemon = served(WATCHDOG_USEC="200000")  # ping every 0.1 s
    daemon.start(fresh=True)  # the interpreter's start and its teardown after SIGTERM too
    # READY=1 arrives only once HTTP answers: /health works at that very moment.
    health = daemon.get("/health")
    assert health.status_code == 200
    assert health.json()["state"] == "ready"
    fields = [field for _, field in daemon.messages]
    assert fields.index("STATUS=starting tfd 0.1.0") < fields.index("READY=1")
    assert daemon.admin.exists()

    pings = 0
    deadline = time.monotonic() + 5
    while pings < 5 and time.monotonic() < deadline:
        received = daemon.receive(0.5) or []
        pings += received.count("WATCHDOG=1")
    assert pings >= 5, daemon.log()

    daemon.signal(signal.SIGTERM)
    daemon.wait_for("STOPPING=1", 10)
    assert daemon.wait() == 0, daemon.log()
    assert not daemon.admin.exists()
    assert "stopped with exit status 0" in daemon.log()


def test_no_watchdog_pings_without_watchdog_usec(served: type[ServedDaemon]) -> None:
    daemon = served().start()
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert "WATCHDOG=1" not in (daemon.receive(0.2) or [])


def test_sigint_drains_like_sigterm(served: type[ServedDaemon]) -> None:
    daemon = served().start(fresh=True)  # SIGINT as a fresh interpreter handles it
    daemon.signal(signal.SIGINT)
    daemon.wait_for("STOPPING=1", 10)
    assert daemon.wait() == 0


def test_http_on_a_unix_socket(served: type[ServedDaemon], short_tmp: Path) -> None:
    http_socket = short_tmp / "http.sock"
    daemon = served(TF_HTTP_SOCKET=str(http_socket)).start()
    assert daemon.url() == f"http://unix:{http_socket}"
    transport = httpx.HTTPTransport(uds=str(http_socket))
    with httpx.Client(transport=transport, base_url="http://tfd") as client:
        answer = client.get("/health")
    assert answer.status_code == 200
    assert answer.json()["version"] == "0.1.0"
    assert oct(http_socket.stat().st_mode & 0o777) == "0o660"
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0
    assert not http_socket.exists()


def test_a_port_in_use_is_named(short_tmp: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_tfd("serve", env=clean_environ(TF_PORT=str(port),
                                                  TF_ADMIN_SOCKET=str(short_tmp / "a.sock")))
    assert done.returncode == 1
    assert f"tfd: cannot start: cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (short_tmp / "a.sock").exists()


def test_a_second_daemon_on_the_same_admin_socket_is_refused(served: type[ServedDaemon]) -> None:
    first = served().start()
    done = run_tfd("serve", env=first.env | {"NOTIFY_SOCKET": ""})
    assert done.returncode == 1
    assert f"another daemon answers on {first.admin}" in done.stderr
    assert first.get("/health").status_code == 200  # the first one is untouched
    assert first.admin.exists()


def test_a_stale_admin_socket_is_replaced(served: type[ServedDaemon]) -> None:
    daemon = served()
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(daemon.admin))
    stale.close()  # the file stays, nobody answers: a daemon that died
    daemon.start()
    assert daemon.admin_call("status")["ok"] is True


def test_a_model_path_that_is_no_servable_checkpoint_is_refused_by_name(short_tmp: Path) -> None:
    """Exit 2, so systemd does not restart it: no config.json, then one whose tensors are missing (found
    once the daemon reads the headers). A port in use, which a restart may mend, stays exit 1 (above)."""
    empty = short_tmp / "empty"
    empty.mkdir()
    admin = str(short_tmp / "a.sock")
    done = run_tfd("serve", env=clean_environ(TF_MODEL=str(empty), TF_ADMIN_SOCKET=admin))
    assert (done.returncode, done.stderr) == (
        2, f"tfd: configuration refused:\n  TF_MODEL: {empty}/config.json: missing\n")
    bare = short_tmp / "bare"
    bare.mkdir()
    (bare / "config.json").write_text('{"model_type": "qwen3_5_text"}')
    done = run_tfd("serve", env=clean_environ(TF_MODEL=str(bare), TF_ADMIN_SOCKET=admin, TF_PORT="0"))
    assert done.returncode == 2, done.stderr
    assert f"tfd: configuration refused:\n  TF_MODEL: {bare}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr

"""The admin socket: `tfd admin` against a real daemon, the line protocol, other uids refused."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import ServedDaemon, admin_json, clean_environ, run_tfd, started_server
from tfd.server.admin_commands import COMMANDS

NOBODY = 65534


@pytest.fixture(scope="module")
def shared() -> Iterator[ServedDaemon]:
    """One default daemon for the tests that only ask it questions: a start a test was most of their time."""
    with started_server() as daemon:
        yield daemon


def admin(daemon: ServedDaemon, *args: str, user: int | None = None) -> tuple[int, dict[str, object]]:
    done = run_tfd("admin", *args, env=clean_environ(TF_ADMIN_SOCKET=str(daemon.admin)), user=user)
    assert "Traceback" not in done.stderr
    return done.returncode, admin_json(done.stdout) if done.stdout else {}


def raw_lines(path: Path, payload: bytes, answers: int) -> list[dict[str, object]]:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(payload)
        data = b""
        while data.count(b"\n") < answers:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {data!r}"
            data += chunk
    return [json.loads(line) for line in data.splitlines()]


def test_status_settings_and_drain(served: type[ServedDaemon]) -> None:
    daemon = served(TF_API_KEYS="sk-very-secret", TF_DRAIN_TIMEOUT_S="12").start()
    code, answer = admin(daemon, "status")
    assert code == 0
    status = answer["status"]
    assert isinstance(status, dict)
    assert status["state"] == "ready"
    assert status["pid"] == daemon.proc.pid  # type: ignore[union-attr]
    assert status["admin"] == str(daemon.admin)
    assert status["http"][0].startswith("http://127.0.0.1:")
    assert status["running"] == 0

    code, answer = admin(daemon, "settings")
    assert code == 0
    rows = {row["name"]: row for row in answer["settings"]["rows"]}  # type: ignore[index]
    assert rows["TF_API_KEYS"] == {"name": "TF_API_KEYS", "scope": "server", "value": "********",
                                   "source": "environment"}
    assert rows["TF_DRAIN_TIMEOUT_S"]["value"] == "12"
    assert rows["TF_PORT"]["value"] == "0"
    assert rows["TF_LOG_LEVEL"]["source"] == "default"
    assert "sk-very-secret" not in json.dumps(answer)

    code, answer = admin(daemon, "drain")
    assert (code, answer) == (0, {"ok": True, "drain": {"started": True, "running": 0, "timeout_s": 12.0}})
    daemon.wait_for("STOPPING=1", 10)
    assert daemon.wait() == 0
    assert not daemon.admin.exists()


def test_the_socket_is_private(shared: ServedDaemon) -> None:
    daemon = shared
    mode = daemon.admin.stat().st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600


def test_bad_lines_are_answered_and_the_connection_stays(shared: ServedDaemon) -> None:
    daemon = shared
    answers = raw_lines(daemon.admin, b'not json\n[1]\n{"cmd": "reboot"}\n{"cmd": "status", '
                        b'"args": [1]}\n{"cmd": "status", "args": 7}\n\n{"cmd": "status"}\n', 6)
    codes = [answer["error"]["code"] if not answer["ok"] else "ok" for answer in answers]  # type: ignore[index]
    assert codes == ["bad_json", "bad_request", "unknown_command", "bad_request", "bad_request", "ok"]
    assert answers[2]["error"]["message"] == (  # type: ignore[index]
        "unknown command 'reboot'; known: cancel, drain, evict, lanes, learn, pool, settings, status")
    assert answers[3]["error"]["message"] == "status takes no arguments, got 1"  # type: ignore[index]


def test_an_overlong_line_is_refused(shared: ServedDaemon) -> None:
    daemon = shared
    (answer,) = raw_lines(daemon.admin, b"x" * (200 * 1024), 1)
    assert answer["error"]["code"] == "line_too_long"  # type: ignore[index]
    assert daemon.admin_call("status")["ok"] is True  # the daemon serves on


def test_an_error_answer_exits_1(shared: ServedDaemon) -> None:
    daemon = shared
    code, answer = admin(daemon, "reboot")
    assert code == 1
    assert answer["error"]["code"] == "unknown_command"  # type: ignore[index]


def test_help_lists_every_command_and_the_daemon_answers_each(shared: ServedDaemon) -> None:
    helped = run_tfd("admin", "-h", env=clean_environ())
    assert helped.returncode == 0
    assert set(COMMANDS) == {"status", "settings", "pool", "lanes", "learn", "evict", "cancel", "drain"}
    for name, what in COMMANDS.items():
        assert f"  {name}" in helped.stdout and what in helped.stdout
    daemon = shared
    for name in COMMANDS:  # each known, and a malformed argument refused by name (drain then does not drain)
        code, answer = admin(daemon, name, "x", "y")
        assert code == 1 and answer["error"]["code"] == "bad_request", (name, answer)  # type: ignore[index]
    code, answer = admin(daemon, "cancel")  # its one argument missing
    assert code == 1 and "cancel takes one argument" in answer["error"]["message"]  # type: ignore[index]
    code, answer = admin(daemon, "cancel", "cmpl-nobody")
    assert code == 1 and answer["error"]["code"] == "not_found"  # type: ignore[index]
    for name in ("status", "settings", "pool", "lanes", "learn", "evict"):
        assert admin(daemon, name)[0] == 0, name
    assert daemon.admin_call("status")["status"]["state"] == "ready"  # type: ignore[index]


def test_a_path_that_is_no_daemon_is_a_clear_error(short_tmp: Path) -> None:
    plain = short_tmp / "plain.sock"
    plain.write_text("not a socket")
    garbage = short_tmp / "garbage.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(garbage))
        listener.listen()

        def answer_garbage() -> None:
            peer, _ = listener.accept()
            with peer:
                peer.recv(65536)
                peer.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        server = threading.Thread(target=answer_garbage)
        server.start()
        for path in (plain, garbage):
            done = run_tfd("admin", "status", env=clean_environ(TF_ADMIN_SOCKET=str(path)))
            assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
            assert done.stderr.startswith(f"tfd admin: no daemon answered on {path}: "), done.stderr
        server.join(timeout=30)


def test_no_daemon_is_a_clear_error(short_tmp: Path) -> None:
    done = run_tfd("admin", "status", env=clean_environ(TF_ADMIN_SOCKET=str(short_tmp / "none.sock")))
    assert done.returncode == 1
    assert f"tfd admin: no daemon answered on {short_tmp / 'none.sock'}" in done.stderr


def call_as(uid: int, path: Path) -> str:
    """`status` through the admin client, in a forked child running as ``uid``.

    A fork, not a new process: this interpreter lives where another uid may not execute it.
    """
    from tfd.server.admin import call

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        outcome = "crashed"
        try:
            os.setgid(uid)
            os.setuid(uid)
            outcome = json.dumps(call(path, "status", timeout=10))
        except OSError as error:
            outcome = f"OSError errno {error.errno}"
        finally:
            os.write(write_end, outcome.encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        outcome = reader.read().decode()
    os.waitpid(pid, 0)
    return outcome


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the client as another uid")
def test_another_uid_is_refused_and_logged(served: type[ServedDaemon]) -> None:
    daemon = served().start()
    os.chmod(daemon.workdir.parent, 0o755)
    os.chmod(daemon.workdir, 0o755)
    # The 0600 mode alone keeps another user out of connect().
    assert call_as(NOBODY, daemon.admin) == f"OSError errno {errno.EACCES}"
    # With the file opened to everyone, SO_PEERCRED still refuses the caller.
    os.chmod(daemon.admin, 0o666)
    answer = json.loads(call_as(NOBODY, daemon.admin))
    assert answer == {"ok": False, "error": {
        "code": "forbidden", "message": f"uid {NOBODY} may not administer this daemon (it runs as uid 0)"}}
    assert admin(daemon, "status")[0] == 0  # its own uid is still served
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0
    assert f"admin: refused a connection from uid {NOBODY}" in daemon.log()

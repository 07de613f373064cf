"""The access log: one line a request, with its id, route, status, tokens and times; TF_ACCESS_LOG=0."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from support import ServedDaemon, tiny_server
from tfd.engine.request import Admitted, Emitted, Finished
from tfd.server.access import Access, Exchange, logged_path
from tfd.server.bad_request import BadRequest

# Lines are written as requests end, just after their last byte: wait this long for them at most.
LINES_S = 20.0


def access_lines(daemon: ServedDaemon) -> list[dict[str, str]]:
    """Each access line of the daemon's log as its fields."""
    found = []
    for line in daemon.log().splitlines():
        _, marker, rest = line.partition(" tfd.access: ")
        if marker:
            found.append(dict(field.split("=", 1) for field in rest.split(" ")))
    return found


def wait_lines(daemon: ServedDaemon, count: int) -> list[dict[str, str]]:
    deadline = time.monotonic() + LINES_S
    while len(found := access_lines(daemon)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def post(daemon: ServedDaemon, path: str, body: dict[str, Any], request_id: str) -> httpx.Response:
    return httpx.post(daemon.url() + path, json=body, headers={"x-request-id": request_id}, timeout=60)


def test_every_request_gets_one_line_with_its_fields() -> None:
    with tiny_server() as daemon:
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "ignore_eos": True}
        whole = post(daemon, "/v1/completions", {"prompt": "def f(x):", "max_tokens": 4, "ignore_eos": True},
                     "whole")
        with httpx.stream("POST", daemon.url() + "/v1/chat/completions", json={**chat, "stream": True},
                          headers={"x-request-id": "streamed"}, timeout=60) as response:
            assert response.read()
        with httpx.stream("POST", daemon.url() + "/v1/completions", headers={"x-request-id": "gone"},
                          json={"prompt": "a", "max_tokens": 3000, "ignore_eos": True, "stream": True},
                          timeout=60) as response:
            next(response.iter_lines())  # then the client hangs up
        missing = post(daemon, "/v1/completions", {"prompt": "a", "model": "nope"}, "no-model")
        assert missing.status_code == 404
        assert post(daemon, "/v1/chat/completions", {"messages": "Hi"}, "bad-body").status_code == 400
        assert post(daemon, "/v1/completions", {"prompt": "a"}, "bad id").status_code == 400
        assert daemon.get("/v1/models").status_code == 200
        assert daemon.get("/no where").status_code == 404
        assert daemon.get("/health").status_code == 200  # probes log at DEBUG: no line at INFO
        lines = wait_lines(daemon, 8)
        assert len(lines) == 8, lines
        by_id = {line["id"]: line for line in lines}

        line = by_id["cmpl-whole"]
        usage = whole.json()["usage"]
        assert (line["method"], line["route"], line["status"], line["finish"]) == (
            "POST", "/v1/completions", "200", "length")
        assert (int(line["prompt"]), int(line["cached"]), int(line["completion"])) == (
            usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"], 4)
        assert 0 < float(line["ttft_s"]) <= float(line["total_s"])
        assert line["client"].startswith("127.0.0.1:")

        line = by_id["chatcmpl-streamed"]
        assert (line["route"], line["status"], line["completion"], line["finish"]) == (
            "/v1/chat/completions", "200", "3", "length")
        line = by_id["cmpl-gone"]
        assert (line["status"], line["finish"]) == ("200", "disconnected")
        line = by_id["cmpl-no-model"]
        assert (line["status"], line["error"], line["prompt"], line["ttft_s"]) == (
            "404", "model_not_found", "-", "-")
        line = by_id["chatcmpl-bad-body"]
        assert (line["status"], line["error"]) == ("400", "invalid_request_error")
        refused, models, nowhere = (line for line in lines if line["id"] == "-")
        assert (refused["route"], refused["status"], refused["error"]) == (
            "/v1/completions", "400", "invalid_request_id")
        assert (models["method"], models["route"], models["status"]) == ("GET", "/v1/models", "200")
        assert "prompt" not in models and float(models["total_s"]) >= 0
        assert (nowhere["route"], nowhere["status"], nowhere["error"]) == ("/no%20where", "404", "not_found")


def test_no_lines_with_the_access_log_off() -> None:
    with tiny_server(TF_ACCESS_LOG="0") as daemon:
        reply = post(daemon, "/v1/completions", {"prompt": "abc", "max_tokens": 2}, "quiet")
        assert reply.json()["id"] == reply.headers["x-request-id"] == "cmpl-quiet"  # ids stay
        assert daemon.admin_call("drain")["ok"] is True
        assert daemon.wait() == 0  # every line the daemon would write is in its log now
        assert "tfd.access" not in daemon.log()


def test_ids_are_unique_among_live_requests_and_bounded() -> None:
    access = Access()
    first, second = Exchange("POST", "/v1/completions"), Exchange("POST", "/v1/completions")
    assert access.assign(first, "completion", "abc") == "cmpl-abc"
    assert access.assign(second, "completion", "abc") == "cmpl-abc-2"
    running = {"cmpl-abc-3"}  # still in the engine, its exchange closed
    assert access.assign(Exchange("POST", "/"), "completion", "abc", running.__contains__) == "cmpl-abc-4"
    access.close(first)
    assert access.assign(Exchange("POST", "/"), "completion", "abc") == "cmpl-abc"
    assert access.assign(Exchange("POST", "/"), "chat", "abc") == "chatcmpl-abc"
    fresh = access.assign(Exchange("POST", "/"), "chat", None)
    assert fresh.startswith("chatcmpl-") and len(fresh) == len("chatcmpl-") + 32
    assert access.assign(Exchange("POST", "/"), "chat", "a" * 128) == "chatcmpl-" + "a" * 128
    for bad in ("a" * 129, "", "a b", "a\tb", "é", "a,b", "a'b"):
        with pytest.raises(BadRequest) as refused:
            access.assign(Exchange("POST", "/"), "chat", bad)
        assert (refused.value.param, refused.value.code) == ("x-request-id", "invalid_request_id")


def test_a_line_counts_the_engine_s_events() -> None:
    exchange = Exchange("POST", "/v1/completions", "127.0.0.1:5", started=100.0, generating=True,
                        id="cmpl-x", status=200, prompt=9)
    assert exchange.line(100.5) == ("id=cmpl-x method=POST route=/v1/completions status=200 prompt=9 "
                                    "cached=- completion=- ttft_s=- total_s=0.500 client=127.0.0.1:5")
    exchange.saw(Admitted(9, 3))
    exchange.saw(Emitted((1, 2), "ab"))
    assert (exchange.cached, exchange.completion) == (3, 2)
    assert exchange.ttft is not None  # measured here until the engine's own comes
    exchange.saw(Finished("stop", (1, 2, 3), prompt_tokens=9, cached_tokens=3, time_to_first_token=0.25))
    assert exchange.line(101.0) == ("id=cmpl-x method=POST route=/v1/completions status=200 prompt=9 "
                                    "cached=3 completion=3 ttft_s=0.250 total_s=1.000 finish=stop "
                                    "client=127.0.0.1:5")


def test_a_logged_path_cannot_forge_a_field_or_a_line() -> None:
    scope = {"path": "/a b\nid=x", "raw_path": b'/a%20b/"q"\\\n\xc3\xa9' + b"x" * 300}
    shown = logged_path(scope)
    assert shown.startswith("/a%20b/%22q%22%5C%0A%C3%A9x")
    assert all("!" <= c <= "~" for c in shown) and shown.count("x") <= 200
    assert logged_path({"path": "/a b"}) == "/a%20b"

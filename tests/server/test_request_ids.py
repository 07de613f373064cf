"""One request id everywhere: the reply's `id`, `x-request-id`, `tfd admin lanes` and `cancel`, the log."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from support import ServedDaemon, census, tiny_server

LONG = {"prompt": "def f(x):", "max_tokens": 3000, "ignore_eos": True}  # runs until cancelled
# Cancels take effect at the next step; a lane appears once the engine reads its inbox.
SETTLE_S = 20.0


@pytest.fixture(scope="module")
def server() -> Iterator[ServedDaemon]:
    with tiny_server() as daemon:
        daemon.at_load = census(daemon)  # type: ignore[attr-defined]
        yield daemon


def lanes(daemon: ServedDaemon) -> list[dict[str, Any]]:
    answer = daemon.admin_call("lanes")
    assert answer["ok"] is True
    return answer["lanes"]["lanes"]  # type: ignore[index,no-any-return]


def wait_lanes(daemon: ServedDaemon, count: int) -> list[dict[str, Any]]:
    """Admin ``lanes`` once it lists ``count`` lanes, all decoding."""
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        found = lanes(daemon)
        if len(found) == count and all(lane["phase"] == "decode" for lane in found):
            return found
        time.sleep(0.05)
    raise AssertionError(f"lanes never showed {count} decoding: {lanes(daemon)}")


def settled(daemon: ServedDaemon) -> dict[str, Any]:
    """The census once every lane has gone."""
    deadline = time.monotonic() + SETTLE_S
    while (now := census(daemon))["lanes"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return now


def cancel(daemon: ServedDaemon, request_id: str) -> None:
    assert daemon.admin_call_args("cancel", [request_id]) == {"ok": True, "cancel": {"request": request_id}}


def events(lines: Iterator[str]) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def access_lines(daemon: ServedDaemon, request_id: str) -> list[str]:
    """The access log's lines of ``request_id``, once there is one (written as the request ends)."""
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        found = [line for line in daemon.log().splitlines()
                 if " tfd.access: " in line and f" tfd.access: id={request_id} " in line]
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"no access line for {request_id}:\n{daemon.log()}")


def test_a_streamed_reply_s_id_is_the_lane_admin_lists_and_cancels(server: ServedDaemon) -> None:
    with httpx.stream("POST", server.url() + "/v1/completions", json={**LONG, "stream": True},
                      timeout=60) as response:
        lines = response.iter_lines()
        first = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
        request_id = first["id"]
        assert request_id.startswith("cmpl-")
        assert response.headers["x-request-id"] == request_id
        assert [lane["request"] for lane in wait_lanes(server, 1)] == [request_id]
        cancel(server, request_id)
        rest = events(lines)
    assert {chunk["id"] for chunk in rest} == {request_id}
    assert rest[-1]["choices"][0]["finish_reason"] == "cancelled"
    assert settled(server) == server.at_load  # type: ignore[attr-defined]
    (line,) = access_lines(server, request_id)
    assert " method=POST route=/v1/completions status=200 " in line and " finish=cancelled " in line


def test_a_whole_reply_s_id_is_the_lane_admin_lists_and_cancels(server: ServedDaemon) -> None:
    import openai

    client = openai.OpenAI(base_url=server.url() + "/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    got: dict[str, Any] = {}

    def ask() -> None:
        got["raw"] = client.completions.with_raw_response.create(
            model=model, prompt=LONG["prompt"], max_tokens=LONG["max_tokens"],
            extra_body={"ignore_eos": True})

    asking = threading.Thread(target=ask)
    asking.start()
    try:
        (lane,) = wait_lanes(server, 1)
        cancel(server, lane["request"])
    finally:
        asking.join(60)
    raw = got["raw"]
    reply = raw.parse()
    assert reply.id == lane["request"] == raw.headers["x-request-id"]
    assert reply.id.startswith("cmpl-")
    assert reply.choices[0].finish_reason == "cancelled"
    assert settled(server) == server.at_load  # type: ignore[attr-defined]
    (line,) = access_lines(server, reply.id)
    assert " status=200 " in line and " finish=cancelled " in line


def test_the_client_s_request_id_is_the_base_of_the_id(server: ServedDaemon) -> None:
    headers = {"x-request-id": "trace-7f3a.1"}
    whole = httpx.post(server.url() + "/v1/completions", json={"prompt": "abc", "max_tokens": 2},
                       headers=headers, timeout=60)
    assert whole.status_code == 200
    assert whole.json()["id"] == whole.headers["x-request-id"] == "cmpl-trace-7f3a.1"
    chat = httpx.post(server.url() + "/v1/chat/completions", headers=headers, timeout=60,
                      json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert chat.json()["id"] == chat.headers["x-request-id"] == "chatcmpl-trace-7f3a.1"
    # a refusal after the id was given carries it too
    refused = httpx.post(server.url() + "/v1/completions", json={"prompt": "abc", "model": "nope"},
                         headers=headers, timeout=60)
    assert refused.status_code == 404 and refused.headers["x-request-id"] == "cmpl-trace-7f3a.1"
    # without one, a fresh id; routes that generate nothing have none
    fresh = httpx.post(server.url() + "/v1/completions", json={"prompt": "abc", "max_tokens": 1}, timeout=60)
    assert fresh.headers["x-request-id"] == fresh.json()["id"] != "cmpl-trace-7f3a.1"
    assert "x-request-id" not in server.get("/v1/models").headers


@pytest.mark.parametrize("bad", ["has space", "x" * 129, 'quo"te', "semi;colon", ""])
def test_a_malformed_client_request_id_is_refused_naming_the_header(server: ServedDaemon, bad: str) -> None:
    answer = httpx.post(server.url() + "/v1/completions", json={"prompt": "abc", "max_tokens": 1},
                        headers={"x-request-id": bad}, timeout=60)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request_id", "x-request-id")
    assert "x-request-id" not in answer.headers


def test_two_live_requests_with_one_client_id_get_two_ids(server: ServedDaemon) -> None:
    url, headers, body = server.url() + "/v1/completions", {"x-request-id": "twice"}, {**LONG, "stream": True}
    with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as first:
        assert first.headers["x-request-id"] == "cmpl-twice"
        first_lines = first.iter_lines()
        next(line for line in first_lines if line.startswith("data: "))
        with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as second:
            assert second.headers["x-request-id"] == "cmpl-twice-2"
            second_lines = second.iter_lines()
            assert json.loads(next(line for line in second_lines if line.startswith("data: "))[6:])["id"] \
                == "cmpl-twice-2"
            assert sorted(lane["request"] for lane in wait_lanes(server, 2)) == ["cmpl-twice", "cmpl-twice-2"]
            cancel(server, "cmpl-twice-2")  # the second alone
            assert events(second_lines)[-1]["choices"][0]["finish_reason"] == "cancelled"
        assert [lane["request"] for lane in wait_lanes(server, 1)] == ["cmpl-twice"]
        cancel(server, "cmpl-twice")
        assert events(first_lines)[-1]["choices"][0]["finish_reason"] == "cancelled"
    assert settled(server) == server.at_load  # type: ignore[attr-defined]
    # both gone, the client's id is free again
    again = httpx.post(url, json={"prompt": "abc", "max_tokens": 1}, headers=headers, timeout=60)
    assert again.json()["id"] == "cmpl-twice"

"""The HTTP surface through hypercorn on a loopback port: /health, /metrics, keys, errors."""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio
from starlette.requests import ClientDisconnect

from support import InProcessDaemon
from tfd.server.http import ClosedStream
from tfd.server.openai import OpenAI


@pytest.fixture
async def served(short_tmp: Path, nursery: trio.Nursery, request: pytest.FixtureRequest
                 ) -> AsyncIterator[InProcessDaemon]:
    env = getattr(request, "param", {})
    daemon = InProcessDaemon(short_tmp, **env)
    await nursery.start(daemon.run)
    yield daemon
    daemon.daemon.lifecycle.request_drain("test over")
    with trio.fail_after(10):
        await daemon.done.wait()


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one Prometheus sample in ``text``."""
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    for line in text.splitlines():
        match = re.fullmatch(r"([a-z_:]+)(?:\{(.*)\})? (\S+)", line)
        if match and match[1] == name and ",".join(sorted((match[2] or "").split(","))) == wanted:
            return float(match[3])
    raise AssertionError(f"no sample {name}{{{wanted}}}")


async def test_health_reports_state_uptime_and_version(served: InProcessDaemon) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        first = await client.get("/health")
        await trio.sleep(0.05)
        second = await client.get("/health")
    assert first.status_code == 200
    assert first.headers["content-type"] == "application/json"
    body = first.json()
    assert set(body) == {"state", "uptime_s", "version", "model", "lanes"}
    assert body["lanes"] == {"running": 0, "waiting": 0}
    assert body["state"] == "ready"
    assert body["version"] == "0.1.0"
    assert second.json()["uptime_s"] > body["uptime_s"] >= 0


async def test_metrics_count_requests_and_show_the_process(served: InProcessDaemon) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        for _ in range(3):
            await client.get("/health")
        await client.get("/nowhere")
        text = (await client.get("/metrics")).text
        later = (await client.get("/metrics")).text
    assert sample(text, "tfd_http_requests_total", route="/health", method="GET", status="200") == 3
    assert sample(text, "tfd_http_requests_total", route="unmatched", method="GET", status="404") == 1
    assert sample(later, "tfd_http_requests_total", route="/metrics", method="GET", status="200") == 1
    assert sample(text, "tfd_http_requests_in_flight") == 1  # the /metrics request itself
    assert sample(text, "tfd_http_request_duration_seconds_count", route="/health") == 3
    assert sample(text, "process_resident_memory_bytes") > 1e6
    assert sample(text, "process_cpu_seconds_total") > 0
    assert sample(text, "tfd_state", state="ready") == 1
    assert sample(text, "tfd_state", state="draining") == 0
    assert sample(text, "tfd_build_info", version="0.1.0") == 1
    assert sample(text, "tfd_uptime_seconds") > 0


async def test_errors_are_json_in_openai_shape(served: InProcessDaemon) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        missing = await client.get("/v2/nothing")
        wrong_method = await client.post("/health", json={})
    assert missing.status_code == 404
    assert missing.json() == {"error": {"message": "no route /v2/nothing", "type": "not_found_error",
                                        "param": None, "code": "not_found"}}
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["code"] == "method_not_allowed"
    assert "GET" in wrong_method.headers["allow"]


async def test_an_unhandled_error_answers_json_and_the_server_goes_on(served: InProcessDaemon,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: OpenAI) -> None:
        raise RuntimeError("planted")

    monkeypatch.setattr(OpenAI, "_ready", broken)
    async with httpx.AsyncClient(base_url=served.url) as client:
        failed = await client.get("/v1/models")
        health = await client.get("/health")
        text = (await client.get("/metrics")).text
    assert failed.status_code == 500
    assert failed.json() == {"error": {
        "message": "internal error (RuntimeError); the server's log has the details", "type": "server_error",
        "param": None, "code": "internal_error"}}
    assert health.status_code == 200
    assert sample(text, "tfd_http_requests_total", route="/v1/models", method="GET", status="500") == 1


@pytest.mark.parametrize("served", [{"TF_API_KEYS": "sk-first,sk-second"}], indirect=True)
async def test_api_keys_guard_everything_but_health(served: InProcessDaemon) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        assert (await client.get("/health")).status_code == 200
        bare = await client.get("/metrics")
        wrong = await client.get("/metrics", headers={"Authorization": "Bearer sk-third"})
        basic = await client.get("/metrics", headers={"Authorization": "Basic sk-first"})
        good = await client.get("/metrics", headers={"Authorization": "Bearer sk-second"})
    for refused in (bare, wrong, basic):
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"] == "Bearer"
        assert refused.json()["error"]["code"] == "invalid_api_key"
    assert good.status_code == 200
    assert sample(good.text, "tfd_http_refused_total", reason="api_key") == 3


def _endless_stream(closed: list[str]) -> tuple[object, ClosedStream]:
    async def chunks() -> AsyncGenerator[bytes, None]:
        try:
            while True:
                yield b"data: x\n\n"
        finally:
            closed.append("closed")

    generator = chunks()  # held here, so only an explicit close can run its finally
    return generator, ClosedStream(generator, media_type="text/event-stream")


@pytest.mark.parametrize("spec", ["2.0", "2.4"])
async def test_a_stream_left_at_a_yield_is_closed_before_its_answer_returns(spec: str) -> None:
    """A client leaving while a chunk is being sent: 2.0 servers say so through receive (the send
    is cancelled), 2.4 ones by failing the send; either way the generator's finally has run (the
    lane cancelled, the access line's finish set) when the answer returns to the gate."""
    closed: list[str] = []
    generator, answer = _endless_stream(closed)
    sent: list[dict[str, object]] = []
    gone = trio.Event()

    async def receive() -> dict[str, object]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)
        if len(sent) == 3:  # the second chunk: the client is gone while it is sent
            gone.set()
            if spec == "2.4":
                raise OSError("connection reset")
            await trio.sleep_forever()

    scope = {"type": "http", "asgi": {"spec_version": spec}, "method": "POST", "path": "/"}
    with trio.fail_after(10):
        try:
            await answer(scope, receive, send)
        except ClientDisconnect:
            assert spec == "2.4"
    assert closed == ["closed"]
    assert [message["type"] for message in sent] == ["http.response.start", "http.response.body",
                                                     "http.response.body"]
    del generator


async def test_a_stream_that_ends_is_closed_once() -> None:
    closed: list[str] = []

    async def chunks() -> AsyncGenerator[bytes, None]:
        try:
            yield b"data: [DONE]\n\n"
        finally:
            closed.append("closed")

    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    async def receive() -> dict[str, object]:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    await ClosedStream(chunks())({"type": "http", "method": "POST", "path": "/"}, receive, send)
    assert closed == ["closed"]
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}

"""The OpenAI API through the real HTTP stack: repeat, concurrent == solo, chunked prefill, cancel."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio

from support import ServedDaemon, census, settled, tiny_server, walk_away

SEEDED = {"temperature": 0.8, "top_p": 0.9, "seed": 1234}
GREEDY = {"temperature": 0.0}
PROMPTS = [f"def function_{i}(x):\n    return x * {i} + " + "y" * i for i in range(8)]


@pytest.fixture(scope="module", params=["qwen3_5", "qwen4_exp"])
def server(request: pytest.FixtureRequest) -> Iterator[ServedDaemon]:
    with tiny_server(request.param) as daemon:
        daemon.at_load = census(daemon)  # type: ignore[attr-defined]
        yield daemon


async def lanes(daemon: ServedDaemon, running: int, waiting: int) -> None:
    """Wait until /health shows these lane counts."""
    async with httpx.AsyncClient(base_url=daemon.url()) as client:
        with trio.fail_after(20):
            wanted = {"running": running, "waiting": waiting}
            while (await client.get("/health")).json()["lanes"] != wanted:  # noqa: ASYNC110 (polled)
                await trio.sleep(0.05)


async def complete(client: httpx.AsyncClient, prompt: str, sampling: dict[str, Any], tokens: int = 16,
                   **extra: Any) -> dict[str, Any]:
    response = await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": tokens, **sampling,
                                                          **extra})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
async def test_the_same_request_twice_gives_the_same_tokens(server: ServedDaemon,
                                                            sampling: dict[str, Any]) -> None:
    async with httpx.AsyncClient(base_url=server.url(), timeout=60) as client:
        first = await complete(client, PROMPTS[0], sampling)
        second = await complete(client, PROMPTS[0], sampling)
        chat = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 12, **sampling}
        chats = [(await client.post("/v1/chat/completions", json=chat)).json() for _ in range(2)]
    assert first["tfd"]["token_sha"] == second["tfd"]["token_sha"]
    assert first["choices"][0]["text"] == second["choices"][0]["text"]
    assert chats[0]["tfd"]["token_sha"] == chats[1]["tfd"]["token_sha"]
    assert first["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
async def test_concurrent_equals_solo(server: ServedDaemon, sampling: dict[str, Any]) -> None:
    async with httpx.AsyncClient(base_url=server.url(), timeout=120) as client:
        solo = [(await complete(client, prompt, sampling))["tfd"]["token_sha"] for prompt in PROMPTS]
        for width in (1, 2, 4, 8):
            got: dict[int, str] = {}

            async def one(i: int, got: dict[int, str] = got) -> None:
                got[i] = (await complete(client, PROMPTS[i], sampling))["tfd"]["token_sha"]

            for first in range(0, len(PROMPTS), width):
                async with trio.open_nursery() as nursery:
                    for i in range(first, min(first + width, len(PROMPTS))):
                        nursery.start_soon(one, i)
            assert [got[i] for i in range(len(PROMPTS))] == solo, f"{width} at once"
    assert await settled(server) == server.at_load  # type: ignore[attr-defined]


async def test_a_prompt_longer_than_a_step_equals_it_with_a_larger_step(server: ServedDaemon) -> None:
    family = server.env["TF_MODEL"].rsplit("/", 1)[-1].removesuffix("-served")
    prompt = " ".join(f"word{i}" for i in range(300))  # about 700 tokens: three 256-row steps
    async with httpx.AsyncClient(base_url=server.url(), timeout=120) as client:
        small = await complete(client, prompt, GREEDY, 8)
    assert small["usage"]["prompt_tokens"] > 2 * 256
    with tiny_server(family, TF_STEP_TOKENS="2048") as large_server:
        async with httpx.AsyncClient(base_url=large_server.url(), timeout=120) as client:
            large = await complete(client, prompt, GREEDY, 8)
    assert small["tfd"]["token_sha"] == large["tfd"]["token_sha"]


async def test_cancelled_clients_leave_the_pool_as_at_load(server: ServedDaemon) -> None:
    long_prompt = " ".join(f"word{i}" for i in range(400))
    # Mid-prefill: the prompt's chunks take several steps; the client is gone after the headers.
    with trio.move_on_after(0.1):
        await walk_away(server, {"prompt": long_prompt, "max_tokens": 50}, b"never comes")
    # Mid-decode: a stream read for a few chunks, then closed.
    stream = {"prompt": "def f(x):", "max_tokens": 400, "stream": True, "ignore_eos": True}
    await walk_away(server, stream, b"data: ", times=4)
    assert await settled(server) == server.at_load  # type: ignore[attr-defined]
    await lanes(server, running=0, waiting=0)


async def test_a_queued_client_that_leaves_and_a_full_queue(server: ServedDaemon) -> None:
    family = server.env["TF_MODEL"].rsplit("/", 1)[-1].removesuffix("-served")
    with tiny_server(family, TF_PARALLEL="1", TF_QUEUE_LIMIT="1") as narrow:
        at_load = census(narrow)
        busy = {"prompt": "def f(x):", "max_tokens": 3000, "stream": True, "ignore_eos": True}
        async with trio.open_nursery() as nursery:
            occupied = trio.Event()
            nursery.start_soon(walk_away, narrow, busy, b"data: ", 2, occupied)
            await occupied.wait()
            async with httpx.AsyncClient(base_url=narrow.url(), timeout=60) as client:
                # One waits (the queue holds one), and leaves ...
                with trio.move_on_after(0.3):
                    await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
                await lanes(narrow, running=1, waiting=0)
                # ... another waits, and meanwhile one more is refused with 503 and Retry-After.
                async with trio.open_nursery() as waiting:
                    waiting.start_soon(walk_away, narrow, {"prompt": "y", "max_tokens": 2}, b"never", 1)
                    await lanes(narrow, running=1, waiting=1)
                    full = await client.post("/v1/completions", json={"prompt": "z", "max_tokens": 2})
                    assert full.status_code == 503
                    assert full.headers["retry-after"] == "2"
                    assert full.json()["error"]["code"] == "queue_full"
                    waiting.cancel_scope.cancel()  # the queued client leaves
            nursery.cancel_scope.cancel()  # and the one holding the lane
        assert await settled(narrow) == at_load
        async with httpx.AsyncClient(base_url=narrow.url(), timeout=60) as client:
            assert (await complete(client, "still serving", GREEDY, 2))["usage"]["completion_tokens"] >= 1

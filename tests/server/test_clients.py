"""Real clients: the official openai package, and a soak of many clients that come and go."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio

from support import ServedDaemon, tiny_server


@pytest.fixture(scope="module")
def server() -> Iterator[ServedDaemon]:
    with tiny_server("qwen4_exp", TF_CONTEXT="512") as daemon:
        yield daemon


def test_the_openai_client(server: ServedDaemon) -> None:
    import openai

    client = openai.OpenAI(base_url=server.url() + "/v1", api_key="unused")
    model = client.models.list().data[0].id
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello"}],
                                          max_tokens=8, temperature=0)
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage is not None
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens
    assert chat.usage.completion_tokens <= 8

    chunks = list(client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0,
        stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == chat.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == chat.choices[0].finish_reason

    completion = client.completions.create(model=model, prompt="def f(x):", max_tokens=6, temperature=0,
                                           logprobs=2)
    usage = completion.usage
    assert usage is not None
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.token_logprobs is not None
    assert len(logprobs.token_logprobs) == usage.completion_tokens
    assert all(value <= 0 for value in logprobs.token_logprobs)


# A client cancelled inside httpx's streaming read leaves httpx's body iterator (an async generator,
# ByteStream.__aiter__) to be finalised later, in this test process; its finaliser may complain as
# an unraisable exception. That is the test client's library, not the server under test.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_soak_of_clients_that_come_and_go(server: ServedDaemon) -> None:
    at_load = server.admin_call("pool")["pool"]["census"]  # type: ignore[index]
    rng = random.Random(7)
    plans = [{"prompt": " ".join(f"w{rng.randrange(100)}" for _ in range(rng.randrange(1, 120))),
              "max_tokens": rng.randrange(1, 24), "temperature": rng.choice([0.0, 0.7]),
              "seed": rng.randrange(99), "stream": rng.random() < 0.5, "leave": rng.random() < 0.2}
             for _ in range(200)]
    outcomes: dict[str, int] = {"done": 0, "left": 0}
    errors: list[str] = []
    queue = iter(plans)

    async def client_loop(client: httpx.AsyncClient) -> None:
        for plan in queue:
            body: dict[str, Any] = {key: value for key, value in plan.items() if key != "leave"}
            scope = trio.CancelScope()
            if plan["leave"]:  # this client hangs up after a moment, wherever its request is
                scope.deadline = trio.current_time() + rng.uniform(0.01, 0.2)
            try:
                with scope:
                    if body["stream"]:
                        async with client.stream("POST", "/v1/completions", json=body) as response:
                            await response.aread()
                    else:
                        response = await client.post("/v1/completions", json=body)
                    if response.status_code != 200:
                        errors.append(f"{response.status_code}: {response.text}")
            except httpx.HTTPError as error:
                errors.append(repr(error))
            outcomes["left" if scope.cancelled_caught else "done"] += 1

    async with httpx.AsyncClient(base_url=server.url(), timeout=120,
                                 limits=httpx.Limits(max_connections=32)) as client, \
            trio.open_nursery() as nursery:
            for _ in range(16):
                nursery.start_soon(client_loop, client)
    assert errors == []
    assert outcomes["done"] + outcomes["left"] == 200
    with trio.fail_after(20):
        # Cancels land at the engine's next step: poll the server until they have.
        while (now := server.admin_call("pool")["pool"]["census"]) != at_load:  # type: ignore[index] # noqa: ASYNC110
            await trio.sleep(0.05)
    assert now == at_load

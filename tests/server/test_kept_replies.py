"""resumed == fresh through the real HTTP stack: a chat's second turn resumes from the state its first
turn kept (``usage.prompt_tokens_details.cached_tokens`` says how much) and answers what a fresh
prefill answers, greedy and seeded, drafting and not; an edited last message resumes from the state
kept before it. Admin ``learn`` reports the cache, ``evict`` empties it, ``/metrics`` counts hits."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from support import ServedDaemon, census, tiny_server

SAMPLINGS = {"greedy": {"temperature": 0.0}, "seeded": {"temperature": 0.9, "seed": 5}}
SYSTEM = "You answer in Python. " + " ".join(f"rule {i}: keep it short." for i in range(12))


@pytest.fixture(scope="module")
def server() -> Iterator[ServedDaemon]:
    # a resumed turn keeps at every point, so an edited last message resumes from the mark before it
    with tiny_server("qwen3_5", head=True, TF_DRAFTS="1", TF_MTP_DRAFTS="2", TF_MTP_CONFIDENCE="0",
                     TF_PROMPT_KEEP_GAIN="0") as daemon:
        yield daemon


async def chat(client: httpx.AsyncClient, messages: list[dict[str, str]], sampling: dict[str, Any],
               **extra: Any) -> dict[str, Any]:
    response = await client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 12,
                                                               **sampling, **extra})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def evicted(server: ServedDaemon) -> int:
    """Admin ``evict``: how many kept states it evicted."""
    answer = server.admin_call("evict")["evict"]
    assert isinstance(answer, dict)
    return int(answer["evicted"])


def cached(reply: dict[str, Any]) -> int:
    return int(reply["usage"]["prompt_tokens_details"]["cached_tokens"])


@pytest.mark.parametrize("draft", [True, False])
@pytest.mark.parametrize("name", list(SAMPLINGS))
async def test_a_second_turn_resumes_and_answers_as_fresh(server: ServedDaemon, name: str, draft: bool
                                                          ) -> None:
    sampling = {**SAMPLINGS[name], "draft": draft}
    at_load = census(server)
    first = [{"role": "system", "content": SYSTEM},
             {"role": "user", "content": f"Sum a list ({name}, {draft})."}]
    async with httpx.AsyncClient(base_url=server.url(), timeout=120) as client:
        # a reply past 64 tokens: the mark before the next user message is past the first keep point
        turn1 = await chat(client, first, sampling, max_tokens=80, ignore_eos=True)
        assert cached(turn1) == 0
        second = [*first, {"role": "assistant", "content": turn1["choices"][0]["message"]["content"]},
                  {"role": "user", "content": "Now sort it, and say why in a few words."}]
        resumed = await chat(client, second, sampling)
        # the first turn's prompt, rounded down to 64 tokens, leaving its last row to run
        assert cached(resumed) == (turn1["usage"]["prompt_tokens"] - 1) // 64 * 64 > 0
        edited = [*second[:-1], {"role": "user", "content": "Now reverse it instead."}]
        from_the_mark = await chat(client, edited, sampling)  # kept before the latest user message
        assert cached(from_the_mark) > cached(resumed)
        assert evicted(server) > 0
        fresh = await chat(client, second, sampling)
        evicted(server)  # the fresh second turn kept a state before its latest message too
        fresh_edited = await chat(client, edited, sampling)
    assert cached(fresh) == cached(fresh_edited) == 0
    assert resumed["tfd"]["token_sha"] == fresh["tfd"]["token_sha"]
    assert resumed["choices"][0]["message"] == fresh["choices"][0]["message"]
    assert from_the_mark["tfd"]["token_sha"] == fresh_edited["tfd"]["token_sha"]
    assert census(server) == at_load  # pages only kept states hold count free


async def test_a_request_that_bypasses_the_cache_neither_resumes_nor_keeps(server: ServedDaemon) -> None:
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Write a loop."}]
    async with httpx.AsyncClient(base_url=server.url(), timeout=120) as client:
        turn1 = await chat(client, first, SAMPLINGS["greedy"])
        second = [*first, {"role": "assistant", "content": turn1["choices"][0]["message"]["content"]},
                  {"role": "user", "content": "Now a function."}]
        before = server.admin_call("learn")["learn"]["memory"]  # type: ignore[index]
        bypassed = await chat(client, second, SAMPLINGS["greedy"], cache=False)
        after = server.admin_call("learn")["learn"]["memory"]  # type: ignore[index]
        resumed = await chat(client, second, SAMPLINGS["greedy"])
    assert cached(bypassed) == 0 and cached(resumed) > 0
    counted = ("entries", "hits", "misses")
    assert [after[name] for name in counted] == [before[name] for name in counted]
    assert bypassed["tfd"]["token_sha"] == resumed["tfd"]["token_sha"]
    evicted(server)


async def test_admin_and_metrics_report_the_cache(server: ServedDaemon) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Count to three."}]
    async with httpx.AsyncClient(base_url=server.url(), timeout=120) as client:
        await chat(client, messages, SAMPLINGS["greedy"])
        again = await chat(client, [*messages, {"role": "assistant", "content": "1 2 3"},
                                    {"role": "user", "content": "And back."}], SAMPLINGS["greedy"])
    assert cached(again) > 0
    learn = server.admin_call("learn")["learn"]
    assert isinstance(learn, dict) and learn["enabled"] is True
    memory = learn["memory"]
    assert memory["entries"] >= 2 and memory["hits"] >= 1 and 0 < memory["bytes"] <= memory["budget"]
    metrics = server.get("/metrics").text
    hit = 'tfd_prompt_cache_lookups_total{result="hit"}'
    hits = next(line for line in metrics.splitlines() if line.startswith(hit))
    assert float(hits.split()[-1]) >= 1
    assert 'tfd_tokens_total{kind="cached"}' in metrics
    assert evicted(server) == memory["entries"]
    assert server.admin_call("learn")["learn"]["memory"]["entries"] == 0  # type: ignore[index]

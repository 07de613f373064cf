"""drafted == plain through the real HTTP stack: a server that drafts from its MTP head answers every
request with the tokens of ``"draft": false``, alone and side by side, and says what it drafted."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio

from support import ServedDaemon, census, settled, tiny_server, walk_away

PROMPTS = [f"def function_{i}(x):\n    return x * {i} + " + "y" * i for i in range(4)]
SAMPLINGS = {"greedy": {"temperature": 0.0}, "seeded": {"temperature": 0.8, "top_p": 0.9, "seed": 77}}


@pytest.fixture(scope="module")
def server() -> Iterator[ServedDaemon]:
    with tiny_server("qwen3_5", head=True, TF_DRAFTS="1", TF_MTP_DRAFTS="3", TF_MTP_CONFIDENCE="0") as daemon:
        yield daemon


async def complete(client: httpx.AsyncClient, prompt: str, sampling: dict[str, Any], **extra: Any
                   ) -> dict[str, Any]:
    response = await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 20, **sampling,
                                                          **extra})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", list(SAMPLINGS))
async def test_drafted_replies_are_the_plain_replies(server: ServedDaemon, name: str) -> None:
    sampling = SAMPLINGS[name]
    at_load = census(server)
    async with httpx.AsyncClient(base_url=server.url(), timeout=120) as client:
        plain = [await complete(client, prompt, sampling, draft=False) for prompt in PROMPTS]
        drafted = [await complete(client, prompt, sampling) for prompt in PROMPTS]
        together: dict[int, dict[str, Any]] = {}

        async def one(i: int) -> None:
            together[i] = await complete(client, PROMPTS[i], sampling)

        async with trio.open_nursery() as nursery:
            for i in range(len(PROMPTS)):
                nursery.start_soon(one, i)
    for i, (off, on) in enumerate(zip(plain, drafted, strict=True)):
        assert on["tfd"]["token_sha"] == off["tfd"]["token_sha"] == together[i]["tfd"]["token_sha"], i
        assert on["choices"][0]["text"] == off["choices"][0]["text"]
        tokens = off["usage"]["completion_tokens"]
        assert (off["tfd"]["drafted"], off["tfd"]["rounds"], off["tfd"]["narrowest_window"]) == \
            (0, tokens, None)
        assert on["tfd"]["drafted"] >= 1 and on["tfd"]["rounds"] <= tokens
        assert on["tfd"]["rounds"] == tokens - on["tfd"]["accepted"]  # a round: its kept drafts and one
    assert census(server) == at_load


async def test_clients_that_leave_during_rounds_leave_the_pool_as_at_load(server: ServedDaemon) -> None:
    at_load = census(server)
    # mid-round: streams read for a few chunks (each a round's kept tokens), then closed; one greedy, one
    # seeded, together, so a step's verify pass holds both windows when they go
    streams = [{"prompt": prompt, "max_tokens": 400, "stream": True, "ignore_eos": True, **sampling}
               for prompt, sampling in zip(PROMPTS, SAMPLINGS.values(), strict=False)]
    async with trio.open_nursery() as nursery:
        for body, times in zip(streams, (3, 6), strict=True):
            nursery.start_soon(walk_away, server, body, b"data: ", times)
    # mid-prefill: a long prompt's client gone after the headers
    with trio.move_on_after(0.1):
        await walk_away(server, {"prompt": " ".join(f"w{i}" for i in range(400)), "max_tokens": 50},
                        b"never comes")
    assert await settled(server) == at_load


async def test_flash_next_drafted_replies_are_its_plain_replies() -> None:
    # PLE rows, QSA blocks and the head's streams through verify rounds and their commit
    drafting = {"TF_DRAFTS": "1", "TF_MTP_DRAFTS": "3", "TF_MTP_CONFIDENCE": "0"}
    with tiny_server("qwen4_exp", head=True, **drafting) as daemon:
        at_load = census(daemon)
        async with httpx.AsyncClient(base_url=daemon.url(), timeout=120) as client:
            for sampling in SAMPLINGS.values():
                for prompt in PROMPTS[:2]:
                    plain = await complete(client, prompt, sampling, draft=False)
                    drafted = await complete(client, prompt, sampling)
                    assert drafted["tfd"]["token_sha"] == plain["tfd"]["token_sha"]
                    assert drafted["tfd"]["drafted"] >= 1
        assert census(daemon) == at_load


async def test_metrics_count_drafts_and_their_acceptance(server: ServedDaemon) -> None:
    async with httpx.AsyncClient(base_url=server.url(), timeout=120) as client:
        before = values((await client.get("/metrics")).text)
        replies = [await complete(client, prompt, SAMPLINGS["greedy"]) for prompt in PROMPTS]
        after = values((await client.get("/metrics")).text)
    drafted, accepted = 'tfd_drafts_total{kind="drafted"}', 'tfd_drafts_total{kind="accepted"}'
    assert after[drafted] - before.get(drafted, 0) == sum(reply["tfd"]["drafted"] for reply in replies)
    assert after[accepted] - before.get(accepted, 0) == sum(reply["tfd"]["accepted"] for reply in replies)
    assert after["tfd_draft_acceptance"] == pytest.approx(after[accepted] / after[drafted])


def values(text: str) -> dict[str, float]:
    """Prometheus text as sample name (with labels) to value."""
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


async def test_a_server_drafts_unless_told_not_to() -> None:
    # TF_DRAFTS is on by default: a checkpoint with a head decodes in rounds, TF_DRAFTS=0 a token a step
    replies = {}
    for drafts in ("1", None, "0"):
        env = {} if drafts is None else {"TF_DRAFTS": drafts}
        with tiny_server("qwen3_5", head=True, **env) as daemon:
            async with httpx.AsyncClient(base_url=daemon.url(), timeout=120) as client:
                replies[drafts] = await complete(client, PROMPTS[0], SAMPLINGS["greedy"])
    tokens = replies["0"]["usage"]["completion_tokens"]
    assert (replies["0"]["tfd"]["drafted"], replies["0"]["tfd"]["rounds"]) == (0, tokens)
    counts = [{key: replies[d]["tfd"][key] for key in ("token_sha", "drafted", "accepted", "rounds")}
              for d in (None, "1")]
    assert counts[0] == counts[1] and counts[0]["drafted"] >= 1
    assert replies[None]["tfd"]["token_sha"] == replies["0"]["tfd"]["token_sha"]
    assert replies[None]["choices"] == replies["0"]["choices"]

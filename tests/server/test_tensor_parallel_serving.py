"""``tfd serve`` with TF_TENSOR_PARALLEL=2 on the CPU: rank 0 hears clients and a second process runs
the same steps on its half of every layer (gloo). Through the official client, each reply is the one
process's reply (greedy, seeded sampling, several choices, a JSON grammar, streamed), lanes side by
side draw what they draw alone, and SIGTERM stops both processes, exit status 0."""

from __future__ import annotations

import concurrent.futures
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from support import ServedDaemon, started_server

STOP_S = 60  # SIGTERM: the drain, the other rank's last step and its exit, on a busy machine
ASKED: list[dict[str, Any]] = [
    {"prompt": "def fibonacci(n):", "max_tokens": 16, "temperature": 0},
    {"prompt": "import os\n", "max_tokens": 12, "temperature": 0.8, "seed": 3, "n": 2},
    {"prompt": "class Stack:\n    def push(self, item):", "max_tokens": 20, "temperature": 0.6, "seed": 9},
]


@pytest.fixture(scope="module")
def one() -> Iterator[ServedDaemon]:
    with started_server() as daemon:
        yield daemon


@pytest.fixture(scope="module")
def two() -> Iterator[ServedDaemon]:
    with started_server(TF_TENSOR_PARALLEL="2") as daemon:
        yield daemon


MODEL = "tfd-demo-qwen3_5"


def client(server: ServedDaemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url() + "/v1", api_key="unused", max_retries=0)


def completion(server: ServedDaemon, asked: dict[str, Any]) -> list[tuple[str, str]]:
    """Each choice's text and ``token_sha``."""
    body = dict(asked)
    with client(server) as talk:
        reply = talk.completions.create(model=MODEL, prompt=body.pop("prompt"),
                                        max_tokens=body.pop("max_tokens"), extra_body=body)
    extra = reply.model_extra or {}
    if len(reply.choices) == 1:
        return [(reply.choices[0].text, extra["tfd"]["token_sha"])]
    return [(choice.text, (choice.model_extra or {})["tfd"]["token_sha"]) for choice in reply.choices]


def test_each_reply_is_one_processes_and_lanes_beside_others_draw_what_they_draw_alone(
        one: ServedDaemon, two: ServedDaemon) -> None:
    alone = [completion(two, asked) for asked in ASKED]
    assert alone == [completion(one, asked) for asked in ASKED]
    with concurrent.futures.ThreadPoolExecutor(len(ASKED)) as threads:
        together = list(threads.map(lambda asked: completion(two, asked), ASKED))
    assert together == alone


def test_a_grammar_and_a_stream_are_one_processes(one: ServedDaemon, two: ServedDaemon) -> None:
    def chat(server: ServedDaemon) -> tuple[str | None, str]:
        with client(server) as talk:
            found = talk.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "A record, please."}], max_tokens=24,
                response_format={"type": "json_object"}, seed=5)
            streamed = talk.completions.create(model=MODEL, prompt="for i in range(", max_tokens=10,
                                               temperature=0, stream=True)
            return found.choices[0].message.content, "".join(chunk.choices[0].text for chunk in streamed
                                                             if chunk.choices)

    assert chat(two) == chat(one)
    assert chat(two)[0] is not None and chat(two)[0].startswith("{")  # type: ignore[union-attr]


def test_sigterm_stops_both_processes(two: ServedDaemon) -> None:
    # the module's two-rank server, stopped here: this test comes last of those that serve from it
    daemon = two
    assert daemon.proc is not None
    children = [child for task in Path(f"/proc/{daemon.proc.pid}/task").iterdir()
                for child in (task / "children").read_text().split()]  # any of its threads' children
    assert len(children) == 1  # the other rank
    assert completion(daemon, ASKED[0])
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(STOP_S) == 0
    assert not Path(f"/proc/{children[0]}").exists() or \
        Path(f"/proc/{children[0]}/stat").read_text().split()[2] == "Z", daemon.log()
    assert "tensor parallel: 2 ranks joined" in daemon.log()

"""resumed == fresh after a restart: a server with learned conversations writes its kept states to
disk; a new server on the same directory resumes a conversation's next turn from them and answers
what a fresh prefill answers (token_sha), greedy and seeded, drafting and not. Damage of every kind
(a flipped byte, a truncation, an appended byte, two files swapped) and another identity are refused,
counted and recomputed: the reply is still the fresh one."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support import ServedDaemon, census, tiny_server

SYSTEM = "You answer in Python. " + " ".join(f"rule {i}: keep it short." for i in range(12))
SERVED = {"TF_DRAFTS": "1", "TF_MTP_DRAFTS": "2", "TF_MTP_CONFIDENCE": "0"}


def learning(directory: Path, **env: str) -> Any:
    return tiny_server("qwen3_5", head=True, TF_LEARN_CONVERSATIONS="1", TF_LEARN_DIR=str(directory),
                       TF_IMPRINT_VERIFY="1", **{**SERVED, **env})


def chat(server: ServedDaemon, messages: list[dict[str, str]], **body: Any) -> dict[str, Any]:
    response = httpx.post(server.url() + "/v1/chat/completions", timeout=120,
                          json={"messages": messages, "max_tokens": 12, **body})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def cached(reply: dict[str, Any]) -> int:
    return int(reply["usage"]["prompt_tokens_details"]["cached_tokens"])


def disk(server: ServedDaemon) -> dict[str, Any]:
    learn = server.admin_call("learn")["learn"]
    assert isinstance(learn, dict)
    return learn["disk"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def plain() -> Iterator[ServedDaemon]:
    """A server that learns nothing, for the fresh replies every test compares with; started once."""
    with tiny_server("qwen3_5", head=True, **SERVED) as daemon:
        yield daemon


def fresh_reply(plain: ServedDaemon, messages: list[dict[str, str]], **body: Any) -> dict[str, Any]:
    """A cold prefill's reply: ``"cache": false`` keeps what earlier tests sent from resuming it."""
    reply = chat(plain, messages, cache=False, **body)
    assert cached(reply) == 0
    return reply


FIRST = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Sum a list."}]


def second_turn(first_reply: dict[str, Any]) -> list[dict[str, str]]:
    return [*FIRST, {"role": "assistant", "content": first_reply["choices"][0]["message"]["content"]},
            {"role": "user", "content": "Now sort it."}]


@pytest.mark.parametrize(("temperature", "draft"), [(0.0, True), (0.9, False)])
def test_a_second_turn_after_a_restart_answers_as_fresh(plain: ServedDaemon, tmp_path: Path,
                                                        temperature: float, draft: bool) -> None:
    sampling = {"temperature": temperature, "seed": 3, "draft": draft}
    with learning(tmp_path) as server:
        turn1 = chat(server, FIRST, **sampling)
        keep = (turn1["usage"]["prompt_tokens"] - 1) // 64 * 64
    fresh = fresh_reply(plain, second_turn(turn1), **sampling)
    with learning(tmp_path) as server:  # a new process, an empty memory: the disk is all it has
        at_load = census(server)
        resumed = chat(server, second_turn(turn1), **sampling)
        assert cached(resumed) == keep > 0
        assert resumed["tfd"]["token_sha"] == fresh["tfd"]["token_sha"]
        assert disk(server)["read"] == 1 and census(server) == at_load
        stat = os.stat(next(tmp_path.iterdir()))
        assert stat.st_mode & 0o777 == 0o700


def damage(directory: Path, how: str, position: int) -> None:
    """Damage the files of the learned state at ``position``: every block flipped or grown, its state
    file truncated or swapped with another state's."""
    home = next(p for p in directory.iterdir() if p.is_dir())
    states = sorted((home / "states").iterdir())
    ours = next(p for p in states if p.name.startswith(f"{position:08x}"))
    for block in (home / "blocks").iterdir():
        data = bytearray(block.read_bytes())
        if how == "flip":
            data[len(data) // 2] ^= 0x01
        elif how == "append":
            data.append(0x21)
        block.write_bytes(bytes(data))
    if how == "truncate":
        ours.write_bytes(ours.read_bytes()[:-3])
    elif how == "swap":
        other = next(p for p in states if p != ours)
        a, b = ours.read_bytes(), other.read_bytes()
        ours.write_bytes(b)
        other.write_bytes(a)


@pytest.fixture(scope="module")
def learned(plain: ServedDaemon, tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """A learned directory as a server that learns leaves it after a greedy first turn and another
    question (two states), the first turn's reply, and its second turn's fresh reply; written once for
    the module (the server, the turns and the reply are the same for every kind of damage), each test
    damaging a copy of its own."""
    directory = tmp_path_factory.mktemp("learned")
    with learning(directory) as server:
        turn1 = chat(server, FIRST, temperature=0.0)
        chat(server, [*FIRST[:1], {"role": "user", "content": "Another question, with its own state."}])
    return directory, turn1, fresh_reply(plain, second_turn(turn1), temperature=0.0)


@pytest.mark.parametrize("how", ["flip", "truncate", "append", "swap", "identity"])
def test_damaged_or_foreign_states_are_refused_and_recomputed(
        learned: tuple[Path, dict[str, Any], dict[str, Any]], tmp_path: Path, how: str) -> None:
    sampling = {"temperature": 0.0}
    written, turn1, fresh = learned
    shutil.copytree(written, tmp_path, dirs_exist_ok=True)  # files, modes and times as the server left them
    keep = (turn1["usage"]["prompt_tokens"] - 1) // 64 * 64
    if how == "identity":  # a server that does not draft keeps states without the head's rows: not ours
        env = {"TF_DRAFTS": "0"}
    else:
        damage(tmp_path, how, keep)
        env = {}
    with learning(tmp_path, **env) as server:
        resumed = chat(server, second_turn(turn1), **sampling)
        assert cached(resumed) == 0 and resumed["tfd"]["token_sha"] == fresh["tfd"]["token_sha"]
        refused = disk(server)["refused"]
        assert refused == (0 if how == "identity" else 1)

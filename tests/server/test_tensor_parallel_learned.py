"""Learned conversations under tensor parallel (TF_TENSOR_PARALLEL=2 on the CPU): each rank writes its
own share of every kept state under an identity of its own (its rank is part of it), a restarted
daemon resumes a conversation's next turn from both and answers what one process answers fresh; a
state damaged on one rank alone is recomputed on both (the other's sound read is not used), and the
reply is still the fresh one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support import ServedDaemon, started_server

SYSTEM = "You answer in Python. " + " ".join(f"rule {i}: keep it short." for i in range(12))
FIRST = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Sum a list."}]


def chat(server: ServedDaemon, messages: list[dict[str, str]], **body: Any) -> dict[str, Any]:
    response = httpx.post(server.url() + "/v1/chat/completions", timeout=120,
                          json={"messages": messages, "max_tokens": 12, **body})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def learning(directory: Path) -> Any:
    return started_server(TF_TENSOR_PARALLEL="2", TF_LEARN_CONVERSATIONS="1", TF_LEARN_DIR=str(directory))


def disk(server: ServedDaemon) -> dict[str, Any]:
    learn = server.admin_call("learn")["learn"]
    assert isinstance(learn, dict)
    return learn["disk"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def turns(tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[Path, list[dict[str, str]], str, Path]]:
    """A learned directory holding turn one (written by a two-rank daemon), turn two's messages,
    turn two's fresh reply from one process, and the directory rank 0 wrote in (its identity's)."""
    root = tmp_path_factory.mktemp("learned")
    with learning(root) as server:
        first = chat(server, FIRST)
        own = Path(disk(server)["dir"])
    second = [*FIRST, {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
              {"role": "user", "content": "Now sort it."}]
    with started_server() as one:
        fresh = chat(one, second, cache=False)
    yield root, second, fresh["tfd"]["token_sha"], own


def test_a_restarted_daemon_resumes_from_every_ranks_share(
        turns: tuple[Path, list[dict[str, str]], str, Path]) -> None:
    root, second, fresh, _ = turns
    assert len(list(root.iterdir())) == 2  # an identity a rank
    with learning(root) as server:
        resumed = chat(server, second)
        assert resumed["usage"]["prompt_tokens_details"]["cached_tokens"] == 128
        assert resumed["tfd"]["token_sha"] == fresh
        assert disk(server)["read"] == 1


def test_a_state_damaged_on_one_rank_is_recomputed_on_both(
        turns: tuple[Path, list[dict[str, str]], str, Path], tmp_path: Path) -> None:
    root, second, fresh, own = turns
    other = next(folder for folder in root.iterdir() if folder != own)
    for state in (other / "states").glob("*.st"):  # rank 1's states: a flipped byte in each
        data = bytearray(state.read_bytes())
        data[len(data) // 2] ^= 0x40
        state.write_bytes(bytes(data))
    with learning(root) as server:
        again = chat(server, second)
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # neither rank resumed
        assert again["tfd"]["token_sha"] == fresh
        assert disk(server)["read"] == 1 and disk(server)["refused"] == 0  # rank 0's read was sound

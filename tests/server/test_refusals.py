"""Bad requests are refused with a status and an error that name what is wrong; the server goes on."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from support import ServedDaemon, tiny_server

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def server() -> Iterator[ServedDaemon]:
    with tiny_server("qwen3_5", TF_CONTEXT="256") as daemon:
        yield daemon


def post(server: ServedDaemon, path: str, body: Any, raw: bytes | None = None) -> httpx.Response:
    if raw is not None:
        return httpx.post(server.url() + path, content=raw, headers={"content-type": "application/json"},
                          timeout=30)
    return httpx.post(server.url() + path, json=body, timeout=30)


def error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    return response.json()["error"]  # type: ignore[no-any-return]


def test_a_prompt_over_the_context_is_refused_before_any_stream_byte(server: ServedDaemon) -> None:
    prompt = " ".join(f"w{i}" for i in range(200))
    body = {"prompt": prompt, "max_tokens": 200, "stream": True}
    refused = error(post(server, "/v1/completions", body), 400)
    assert refused["code"] == "context_length_exceeded"
    assert refused["param"] == "prompt"
    assert "maximum context length is 256 tokens" in refused["message"]
    chat = error(post(server, "/v1/chat/completions", {**CHAT, "max_tokens": 300}), 400)
    assert (chat["code"], chat["param"]) == ("context_length_exceeded", "messages")


@pytest.mark.parametrize(("body", "param", "words"), [
    ({**CHAT, "temperature": "hot"}, "temperature", "must be a number"),
    ({**CHAT, "temperature": True}, "temperature", "must be a number"),
    ({**CHAT, "temperature": 3}, "temperature", "from 0 to 2"),
    ({**CHAT, "top_p": 0}, "top_p", "above 0"),
    ({**CHAT, "max_tokens": 0}, "max_tokens", "at least 1"),
    ({**CHAT, "max_tokens": 2.5}, "max_tokens", "integer"),
    ({**CHAT, "seed": "x"}, "seed", "integer"),
    ({**CHAT, "stop": [""]}, "stop", "non-empty string"),
    ({**CHAT, "n": 0}, "n", "n must be an integer from 1 to 64"),
    ({**CHAT, "n": 65}, "n", "n must be an integer from 1 to 64"),
    ({**CHAT, "presence_penalty": 3}, "presence_penalty", "from -2 to 2"),
    ({**CHAT, "repetition_penalty": 0}, "repetition_penalty", "above 0"),
    ({**CHAT, "tools": [{"type": "function"}]}, "tools[0].function", "must be an object"),
    ({**CHAT, "stream": "yes"}, "stream", "boolean"),
    ({**CHAT, "cache": "no"}, "cache", "boolean"),
    ({**CHAT, "top_logprobs": 3}, "top_logprobs", "needs logprobs"),
    ({"messages": []}, "messages", "non-empty"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "one of"),
    ({"messages": [{"role": "user", "content": 7}]}, "messages[0].content", "string"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]", "text"),
])
def test_wrong_fields_are_refused_by_name(server: ServedDaemon, body: dict[str, Any], param: str,
                                          words: str) -> None:
    refused = error(post(server, "/v1/chat/completions", body), 400)
    assert refused["param"] == param
    assert words in refused["message"]


def test_malformed_json_and_bodies(server: ServedDaemon) -> None:
    broken = post(server, "/v1/chat/completions", None, raw=b'{"messages": [')
    assert "not JSON" in error(broken, 400)["message"]
    assert "JSON object" in error(post(server, "/v1/completions", [1, 2]), 400)["message"]
    assert error(post(server, "/v1/completions", {"prompt": 5}), 400)["param"] == "prompt"
    assert error(post(server, "/v1/completions", {"prompt": ["a", "b"]}), 400)["param"] == "prompt"
    assert error(post(server, "/v1/completions", {"prompt": [999999]}), 400)["param"] == "prompt"
    # token ids: JSON's integers (3.0 is one), none below zero, no booleans, on either of the reader's paths
    for ids in ([5, -1], [5.0, -1], [5, True], [True], [5, 2.5], []):
        refused = error(post(server, "/v1/completions", {"prompt": ids}), 400)
        assert refused["param"] == "prompt" and "array of token ids" in refused["message"], ids
    assert "batches" in error(post(server, "/v1/completions", {"prompt": ["a", [5]]}), 400)["message"]
    for ids in ([5, 6], [5, 6.0]):
        done = post(server, "/v1/completions", {"prompt": ids, "max_tokens": 1, "temperature": 0})
        assert done.status_code == 200 and done.json()["usage"]["prompt_tokens"] == 2, ids


def test_an_unknown_model_is_404(server: ServedDaemon) -> None:
    refused = error(post(server, "/v1/chat/completions", {**CHAT, "model": "gpt-9"}), 404)
    assert (refused["code"], refused["param"]) == ("model_not_found", "model")
    served = httpx.get(server.url() + "/v1/models").json()["data"][0]["id"]
    assert post(server, "/v1/chat/completions", {**CHAT, "model": served}).status_code == 200


def test_the_server_serves_on_after_refusals(server: ServedDaemon) -> None:
    for _ in range(3):
        post(server, "/v1/completions", {"prompt": 5})
    done = post(server, "/v1/completions", {"prompt": "def f(x):", "max_tokens": 3, "temperature": 0})
    assert done.status_code == 200
    assert done.json()["usage"]["completion_tokens"] == 3


def test_tokenize_and_detokenize_round_trip(server: ServedDaemon) -> None:
    tokens = post(server, "/tokenize", {"prompt": "def f(x): return 'é'"}).json()
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == 256
    text = post(server, "/detokenize", {"tokens": tokens["tokens"]}).json()["prompt"]
    assert text == "def f(x): return 'é'"
    chat = post(server, "/tokenize", {"messages": CHAT["messages"]}).json()
    text = post(server, "/detokenize", {"tokens": chat["tokens"]}).json()["prompt"]
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert error(post(server, "/detokenize", {"tokens": [-1]}), 400)["param"] == "tokens"


def test_a_body_over_32_mib_is_refused(server: ServedDaemon) -> None:
    huge = b'{"prompt": "' + b"x" * (33 << 20) + b'"}'
    refused = error(post(server, "/v1/completions", None, raw=huge), 413)
    assert refused["code"] == "body_too_large"


def test_return_token_ids_gives_the_prompt_and_reply_ids(server: ServedDaemon) -> None:
    body = {"prompt": "def f(x):", "max_tokens": 4, "temperature": 0, "return_token_ids": True}
    reply = post(server, "/v1/completions", body).json()
    assert reply["prompt_token_ids"] == post(server, "/tokenize", {"prompt": "def f(x):"}).json()["tokens"]
    ids = reply["choices"][0]["token_ids"]
    assert len(ids) == reply["usage"]["completion_tokens"]
    # The reply's text is its ids decoded, an end token (always last) left out.
    decoded = post(server, "/detokenize", {"tokens": ids}).json()["prompt"]
    assert decoded.startswith(reply["choices"][0]["text"])

"""Every field of OpenAI's requests is read, refused by name, or ignored because it changes nothing.

The official ``openai`` package's own request types list the fields a client may send; each must be
one the server reads (its OpenAPI description lists it), and each that tfd does not honour yet is
refused with a 400 naming it unless it holds the value that changes nothing. Ignored fields leave the
reply's tokens as they are. Also here: ``/v1/models/{model}``, a stream's usage only when asked, and
TF_CHAT_TEMPLATE (the server of this file renders chat with a template file of its own).
"""

from __future__ import annotations

import json
import time
import typing
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_create_params

from support import ServedDaemon, tiny_server
from tfd.server.description import chat_request, completion_request
from tfd.server.unsupported import CHAT, COMPLETIONS, IGNORED, RULES, matches

CHAT_BODY = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
COMPLETION_BODY = {"prompt": "def f(x):", "max_tokens": 4, "temperature": 0}
ROUTES = {CHAT: ("/v1/chat/completions", CHAT_BODY), COMPLETIONS: ("/v1/completions", COMPLETION_BODY)}
# a value of each unsupported field that would change the reply, and one that changes nothing
CHANGING: dict[str, Any] = {
    "guided_grammar": "root ::= \"a\"", "guided_whitespace_pattern": " *",
    "guided_decoding_backend": "xgrammar",
    "functions": [{"name": "f"}], "function_call": {"name": "f"},
    "verbosity": "high", "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"},
    "web_search_options": {}, "moderation": {"model": "m"}, "suffix": " return x",
    "stop_token_ids": [5], "include_stop_str_in_output": True, "skip_special_tokens": False,
    "spaces_between_special_tokens": False, "allowed_token_ids": [1, 2], "bad_words": ["x"],
    "truncate_prompt_tokens": 3, "prompt_logprobs": 1, "use_beam_search": True, "length_penalty": 0.5,
    "chat_template": "{{ 'x' }}", "continue_final_message": True, "echo": True, "add_special_tokens": True,
}
NEUTRAL: dict[str, Any] = {
    "functions": [], "function_call": "none", "modalities": ["text"], "suffix": "",
    "stop_token_ids": [], "include_stop_str_in_output": False, "skip_special_tokens": True,
    "spaces_between_special_tokens": True, "bad_words": [], "use_beam_search": False, "length_penalty": 1,
    "continue_final_message": False, "echo": False, "add_special_tokens": False,
}
IGNORED_VALUES: dict[str, Any] = {
    "user": "u-1", "metadata": {"k": "v"}, "store": True, "service_tier": "flex", "safety_identifier": "s",
    "prompt_cache_key": "k", "prompt_cache_retention": "24h", "prompt_cache_options": {"mode": "explicit"},
    "prediction": {"type": "content", "content": "x"},
}
# what a template without tools or a thinking switch (this file's) leaves a reply as it is
NEUTRAL_READ: dict[str, Any] = {"tools": [], "tool_choice": "auto", "parallel_tool_calls": False}
NEUTRAL_TOOLS: dict[str, Any] = {"tool_choice": "none", "tools": [
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}


def openai_fields(params: type) -> set[str]:
    return set(typing.get_type_hints(params))


def test_every_field_the_openai_client_sends_is_in_the_description() -> None:
    chat = openai_fields(chat_create_params.CompletionCreateParamsBase) | {"stream"}
    completions = openai_fields(completion_create_params.CompletionCreateParamsBase) | {"stream"}
    assert chat - set(chat_request()["properties"]) == set()
    assert completions - set(completion_request()["properties"]) == set()


def test_the_tests_cover_every_rule_and_every_ignored_field() -> None:
    assert set(CHANGING) == {rule.name for rule in RULES}
    assert set(NEUTRAL) <= set(CHANGING) and set(IGNORED_VALUES) == set(IGNORED)


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.name)
def test_a_rules_values_are_read_as_json_schema_reads_them(rule: Any) -> None:
    samples = [CHANGING[rule.name], NEUTRAL.get(rule.name), True, False, 0, 1, 0.0, 1.5, "", "none", "text",
               [], ["text"], [1], {}, {"type": "text"}, {"type": "text", "x": 1}, {"type": "json_object"}]
    for value in samples:
        if value is None:
            continue
        expected = jsonschema.Draft202012Validator(rule.accepts).is_valid(value)
        assert matches(value, rule.accepts) == expected, (rule.name, value)
    assert rule.problem(CHANGING[rule.name]) is not None
    assert rule.problem(None) is None and rule.problem(NEUTRAL.get(rule.name)) is None


TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }} said\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedDaemon]:
    template = tmp_path_factory.mktemp("template") / "chat.jinja"
    template.write_text(TEMPLATE)
    with tiny_server("qwen3_5", TF_CONTEXT="256", TF_MODEL_NAME="org/tiny",
                     TF_CHAT_TEMPLATE=str(template)) as daemon:
        yield daemon


def test_the_chat_template_given_renders_chat_requests(server: ServedDaemon) -> None:
    tokens = httpx.post(server.url() + "/tokenize", json={"messages": CHAT_BODY["messages"]}, timeout=60)
    text = httpx.post(server.url() + "/detokenize", json={"tokens": tokens.json()["tokens"]}, timeout=60)
    assert text.json()["prompt"] == "<|im_start|>user said\nHi<|im_end|>\n<|im_start|>assistant\n"


def post(server: ServedDaemon, route: str, extra: dict[str, Any]) -> httpx.Response:
    path, body = ROUTES[route]
    return httpx.post(server.url() + path, json={**body, **extra}, timeout=60)


def token_sha(answer: httpx.Response) -> str:
    assert answer.status_code == 200, answer.text
    return str(answer.json()["tfd"]["token_sha"])


@pytest.mark.parametrize(("route", "name"),
                         [(route, rule.name) for rule in RULES for route in sorted(rule.routes)])
def test_an_unsupported_field_is_refused_by_name_unless_it_changes_nothing(
        server: ServedDaemon, route: str, name: str) -> None:
    refused = post(server, route, {name: CHANGING[name]})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == name and "not supported" in error["message"]
    plain = token_sha(post(server, route, {}))
    assert token_sha(post(server, route, {name: None})) == plain
    if name in NEUTRAL:
        assert token_sha(post(server, route, {name: NEUTRAL[name]})) == plain


@pytest.mark.parametrize("extra", [NEUTRAL_READ, NEUTRAL_TOOLS, {"tool_choice": None, "tools": None}])
def test_tools_not_offered_leave_the_tokens_as_they_are(server: ServedDaemon, extra: dict[str, Any]) -> None:
    assert token_sha(post(server, CHAT, extra)) == token_sha(post(server, CHAT, {}))


@pytest.mark.parametrize(("extra", "param", "words"), [
    ({"tools": NEUTRAL_TOOLS["tools"]}, "tools", "takes no tools"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": NEUTRAL_TOOLS["tools"], "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "tool_choice", "not one of tools"),
    ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools[0].type", "only function tools"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name", "letters"),
    ({"tools": NEUTRAL_TOOLS["tools"] * 2}, "tools[1].function.name", "two tools"),
    ({"parallel_tool_calls": 1}, "parallel_tool_calls", "boolean"),
    ({"reasoning_effort": "low"}, "reasoning_effort", "no thinking switch"),
    ({"reasoning_effort": "lots"}, "reasoning_effort", "must be one of"),
])
def test_tools_and_thinking_the_template_cannot_take_are_refused_by_name(
        server: ServedDaemon, extra: dict[str, Any], param: str, words: str) -> None:
    refused = post(server, CHAT, extra)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == param and words in refused.json()["error"]["message"]


@pytest.mark.parametrize("route", [CHAT, COMPLETIONS])
def test_ignored_fields_leave_the_tokens_as_they_are(server: ServedDaemon, route: str) -> None:
    plain = token_sha(post(server, route, {}))
    assert token_sha(post(server, route, IGNORED_VALUES)) == plain


def test_the_model_is_retrieved_by_its_id_and_another_is_404(server: ServedDaemon) -> None:
    client = openai.OpenAI(base_url=server.url() + "/v1", api_key="unused")
    listed = client.models.list().data[0]
    assert listed.id == "org/tiny"
    model = client.models.retrieve("org/tiny")
    assert model.id == listed.id and model.model_dump() == listed.model_dump()
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("org/other")
    assert missing.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_a_stream_carries_usage_only_when_asked(server: ServedDaemon) -> None:
    client = openai.OpenAI(base_url=server.url() + "/v1", api_key="unused")
    messages: Any = CHAT_BODY["messages"]
    plain = list(client.chat.completions.create(model="org/tiny", messages=messages, max_tokens=4,
                                                temperature=0, stream=True))
    assert all(chunk.usage is None for chunk in plain)
    assert plain[-1].choices[0].finish_reason is not None
    asked = list(client.chat.completions.create(model="org/tiny", messages=messages, max_tokens=4,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
    assert all(chunk.usage is None for chunk in asked[:-1])
    whole = client.chat.completions.create(model="org/tiny", messages=messages, max_tokens=4, temperature=0)
    assert asked[-1].choices == [] and asked[-1].usage == whole.usage


def tokens_of(answer: httpx.Response) -> list[int]:
    assert answer.status_code == 200, answer.text
    return list(answer.json()["choices"][0]["token_ids"])


@pytest.mark.parametrize("route", [CHAT, COMPLETIONS])
def test_logit_bias_moves_the_draw_and_leaves_the_models_logprobs(server: ServedDaemon, route: str) -> None:
    plain = tokens_of(post(server, route, {"return_token_ids": True}))
    assert tokens_of(post(server, route, {"return_token_ids": True, "logit_bias": {}})) == plain
    pushed = (plain[0] + 7) % 200 + 5  # some other token
    forced = post(server, route, {"return_token_ids": True, "logit_bias": {str(pushed): 100}, "logprobs":
                                  True if route == CHAT else 1})
    assert tokens_of(forced) == [pushed] * 4
    if route == CHAT:
        chosen = forced.json()["choices"][0]["logprobs"]["content"][0]["logprob"]
    else:
        chosen = forced.json()["choices"][0]["logprobs"]["token_logprobs"][0]
    assert chosen < -1.0  # the model's, not the biased distribution's (about 0)
    barred = tokens_of(post(server, route, {"return_token_ids": True, "logit_bias": {str(plain[0]): -100}}))
    assert barred[0] != plain[0]
    sampled = {"return_token_ids": True, "temperature": 1.0, "seed": 11}
    assert tokens_of(post(server, route, {**sampled, "logit_bias": {str(plain[0]): 0}})) == \
        tokens_of(post(server, route, sampled))


@pytest.mark.parametrize(("bias", "words"), [({"999999": 1}, "past the vocabulary"), ({"01": 1}, "decimal"),
                                             ({"5": 100.5}, "from -100 to 100"), ({"5": True}, "numbers"),
                                             ([5], "object")])
def test_a_bad_logit_bias_is_refused_by_name(server: ServedDaemon, bias: Any, words: str) -> None:
    refused = post(server, COMPLETIONS, {"logit_bias": bias})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "logit_bias"
    assert words in refused.json()["error"]["message"]


def test_a_biased_request_draws_the_same_beside_others(server: ServedDaemon) -> None:
    import concurrent.futures

    biased = {"return_token_ids": True, "temperature": 1.0, "seed": 3, "logit_bias": {"17": 5, "40": -3}}
    alone = tokens_of(post(server, COMPLETIONS, biased))
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        others = [pool.submit(post, server, COMPLETIONS, {"temperature": 1.0, "seed": i}) for i in range(3)]
        together = pool.submit(post, server, COMPLETIONS, biased)
        assert tokens_of(together.result()) == alone
        assert all(other.result().status_code == 200 for other in others)


def test_min_tokens_is_read_and_a_negative_one_refused(server: ServedDaemon) -> None:
    plain = token_sha(post(server, COMPLETIONS, {}))
    assert token_sha(post(server, COMPLETIONS, {"min_tokens": 0})) == plain
    assert post(server, COMPLETIONS, {"min_tokens": 50}).status_code == 200  # past max_tokens: no end token
    refused = post(server, COMPLETIONS, {"min_tokens": -1})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "min_tokens"


@pytest.mark.parametrize("route", [CHAT, COMPLETIONS])
def test_penalties_are_honoured_and_neutral_values_change_nothing(server: ServedDaemon, route: str) -> None:
    plain = token_sha(post(server, route, {"max_tokens": 12}))
    neutral = {"frequency_penalty": 0, "presence_penalty": 0.0, "repetition_penalty": 1, "max_tokens": 12}
    assert token_sha(post(server, route, neutral)) == plain
    boosted = [{"repetition_penalty": 0.1}, {"frequency_penalty": -2, "presence_penalty": -2}]
    for penalty in boosted:  # the prompt's tokens, and those drawn, made likelier: the greedy reply moves
        assert token_sha(post(server, route, {**penalty, "max_tokens": 12})) != plain, penalty
    penalized = {"frequency_penalty": 2, "presence_penalty": -1.5, "max_tokens": 12}
    assert token_sha(post(server, route, penalized)) == token_sha(post(server, route, penalized))  # repeat



def test_a_huge_number_or_key_is_a_400_not_a_server_error(server: ServedDaemon) -> None:
    long_key = post(server, COMPLETIONS, {"logit_bias": {"9" * 5000: 1}})
    assert long_key.status_code == 400 and long_key.json()["error"]["param"] == "logit_bias"
    raw = b'{"prompt": "x", "seed": ' + b"9" * 5000 + b"}"
    huge = httpx.post(server.url() + "/v1/completions", content=raw,
                      headers={"content-type": "application/json"}, timeout=60)
    assert huge.status_code == 400 and "not JSON" in huge.json()["error"]["message"]


def test_a_stream_that_asks_for_usage_gets_null_usage_before_it(server: ServedDaemon) -> None:
    body = {**COMPLETION_BODY, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url() + "/v1/completions", json=body, timeout=60) as answer:
        events = [line[6:] for line in answer.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(event) for event in events[:-1]]
    assert events[-1] == "[DONE]" and all("usage" in chunk for chunk in chunks)
    assert all(chunk["usage"] is None for chunk in chunks[:-1])
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    refused = post(server, COMPLETIONS, {"stream": True, "stream_options": {"continuous_usage_stats": True}})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "stream_options.continuous_usage_stats"


PROMPT_IDS = [(7 * i) % 300 + 20 for i in range(150)]  # past two chunks: a keep point to share


@pytest.mark.parametrize("route", [CHAT, COMPLETIONS])
def test_n_choices_are_each_the_single_reply_of_their_seed(server: ServedDaemon, route: str) -> None:
    sampled = {"return_token_ids": True, "temperature": 1.0, "seed": 21, "max_tokens": 6}
    three = post(server, route, {**sampled, "n": 3})
    assert three.status_code == 200, three.text
    body = three.json()
    assert [choice["index"] for choice in body["choices"]] == [0, 1, 2]
    alone = [tokens_of(post(server, route, {**sampled, "seed": 21 + i})) for i in range(3)]
    assert [choice["token_ids"] for choice in body["choices"]] == alone
    assert len({tuple(tokens) for tokens in alone}) > 1  # the keys differ, so do the draws
    assert body["usage"]["completion_tokens"] == 18
    assert body["usage"]["prompt_tokens"] == len(body["prompt_token_ids"])
    deadline = time.monotonic() + 30  # the access line is written once the answer is sent
    while not any(f"id={body['id']} " in line and "completion=18 " in line
                  for line in server.log().splitlines()):
        assert time.monotonic() < deadline, "no access line counts every choice's tokens"
        time.sleep(0.05)


def test_n_choices_without_a_seed_take_the_prompts_seed_plus_their_index(server: ServedDaemon) -> None:
    from tfd.engine.request import prompt_seed

    sampled = {"prompt": PROMPT_IDS, "max_tokens": 5, "temperature": 1.0, "return_token_ids": True}
    two = post(server, COMPLETIONS, {**sampled, "n": 2}).json()["choices"]
    assert two[0]["token_ids"] == tokens_of(post(server, COMPLETIONS, sampled))
    second = tokens_of(post(server, COMPLETIONS, {**sampled, "seed": prompt_seed(PROMPT_IDS) + 1}))
    assert two[1]["token_ids"] == second


def test_the_choices_after_the_first_resume_from_its_prompt_state(server: ServedDaemon) -> None:
    body = {"prompt": PROMPT_IDS, "max_tokens": 3, "temperature": 1.0, "seed": 5, "cache": True}
    shared = [(i * 13) % 290 + 9 for i in range(140)]  # a prompt no other test sends
    choices = post(server, COMPLETIONS, {**body, "prompt": shared, "n": 4}).json()["choices"]
    assert [choice["tfd"]["cached_tokens"] for choice in choices] == [0, 128, 128, 128]
    fresh = post(server, COMPLETIONS, {**body, "prompt": shared, "n": 4, "cache": False}).json()["choices"]
    assert [choice["tfd"]["cached_tokens"] for choice in fresh] == [0, 0, 0, 0]
    assert [choice["tfd"]["token_sha"] for choice in fresh] == \
        [choice["tfd"]["token_sha"] for choice in choices]


def test_n_choices_stream_each_under_its_index(server: ServedDaemon) -> None:
    client = openai.OpenAI(base_url=server.url() + "/v1", api_key="unused")
    messages: Any = CHAT_BODY["messages"]
    whole = client.chat.completions.create(model="org/tiny", messages=messages, max_tokens=5, temperature=1,
                                           seed=3, n=3)
    text = {0: "", 1: "", 2: ""}
    finished = {}
    for chunk in client.chat.completions.create(model="org/tiny", messages=messages, max_tokens=5,
                                                temperature=1, seed=3, n=3, stream=True):
        for choice in chunk.choices:
            text[choice.index] += choice.delta.content or ""
            if choice.finish_reason is not None:
                finished[choice.index] = choice.finish_reason
    assert text == {choice.index: choice.message.content for choice in whole.choices}
    assert finished == {choice.index: choice.finish_reason for choice in whole.choices}


def test_too_many_choices_are_refused_by_name(server: ServedDaemon) -> None:
    refused = post(server, COMPLETIONS, {"n": 65})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "n"


def test_n_past_the_queue_limit_is_refused_by_name_and_up_to_it_served() -> None:
    with tiny_server("qwen3_5", TF_CONTEXT="256", TF_QUEUE_LIMIT="2") as small:
        body = {**COMPLETION_BODY, "temperature": 1.0, "seed": 4}
        served = httpx.post(small.url() + "/v1/completions", json={**body, "n": 2}, timeout=60)
        assert served.status_code == 200 and len(served.json()["choices"]) == 2
        refused = httpx.post(small.url() + "/v1/completions", json={**body, "n": 3}, timeout=60)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "n"
        assert "queues 2 requests at most" in refused.json()["error"]["message"]

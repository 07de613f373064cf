"""What Qwen users send, with the official ``openai`` client over HTTP, to a tiny checkpoint that chats
as Qwen3.5 does (its own chat template; its thinking and tool-call tags single tokens).

A tool-call round trip (a forced call, the tool's result, the final answer), whole and streamed;
a named function and one call at most; thinking on and off with the thought apart in
``reasoning_content``, and ``reasoning_effort`` as the switch; JSON that validates against schemas
hypothesis draws, greedy and sampled; a next turn, rendered without the last turn's thought,
resuming from the state kept before the last generation prompt.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import CACHE, ServedDaemon, started_server

MODEL = "qwen-tiny"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city", "days"],
}
ZONE = {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"]}
TOOLS: Any = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The forecast.", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time", "parameters": ZONE}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": ZONE}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris for three days?"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
ANSWER = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["answer", "score"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server() -> Iterator[ServedDaemon]:
    import tiny_models

    model = tiny_models.save_qwen_chat(CACHE / "tiny-head", head=True)
    with started_server(TF_MODEL=str(model), TF_CONTEXT="1024", TF_MODEL_NAME=MODEL) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def client(server: ServedDaemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url() + "/v1", api_key="unused", max_retries=0)


def token_of(server: ServedDaemon, text: str) -> int:
    (token,) = httpx.post(server.url() + "/tokenize", json={"prompt": text}, timeout=30).json()["tokens"]
    return int(token)


def rendered(server: ServedDaemon, messages: Any, **extra: Any) -> str:
    ids = httpx.post(server.url() + "/tokenize", json={"messages": messages, **extra}, timeout=30).json()
    return str(
        httpx.post(server.url() + "/detokenize", json={"tokens": ids["tokens"]}, timeout=30).json()["prompt"]
    )


def streamed_calls(chunks: Any) -> tuple[list[dict[str, str]], str | None]:
    """The calls a stream's ``delta.tool_calls`` build up (arguments joined), and its finish reason."""
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in chunks:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or ():
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += delta.id or ""
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
    return [calls[i] for i in sorted(calls)], finish


def test_the_tags_are_single_tokens_as_in_qwen3_5(server: ServedDaemon) -> None:
    assert len({token_of(server, tag) for tag in ("<tool_call>", "</tool_call>", "<think>", "</think>")}) == 4


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_call_its_result_and_the_final_answer(
    server: ServedDaemon, client: openai.OpenAI, stream: bool
) -> None:
    asked: Any = {
        "model": MODEL,
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": "required",
        "temperature": 0,
        "max_tokens": 150,
        "extra_body": NO_THINKING,
    }
    reply = client.chat.completions.create(**asked)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    if stream:
        calls, finish = streamed_calls(client.chat.completions.create(**asked, stream=True))
        assert finish == "tool_calls" and all(call.pop("id").startswith("call_") for call in calls)
        assert calls == [
            {"name": call.function.name, "arguments": call.function.arguments}
            for call in choice.message.tool_calls
        ]
    first = choice.message.tool_calls[0]
    results = [
        *ASK,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": first.id, "content": "sunny, 21 C"},
    ]
    prompt = rendered(server, results, tools=TOOLS, **NO_THINKING)
    assert (
        f"<function={first.function.name}>" in prompt
        and "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt
    )
    final = client.chat.completions.create(
        model=MODEL,
        messages=results,
        tools=TOOLS,
        tool_choice="none",
        max_tokens=12,
        temperature=0,
        extra_body=NO_THINKING,
        stream=stream,
    )
    if stream:
        parts = list(final)
        assert not any(choice.delta.tool_calls for part in parts for choice in part.choices)
        assert parts[-1].choices[0].finish_reason in ("stop", "length")
    else:
        assert final.choices[0].message.tool_calls is None and final.choices[0].message.content


def test_a_named_function_and_one_call_at_most(client: openai.OpenAI) -> None:
    for parallel in (True, False):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            parallel_tool_calls=parallel,
            temperature=1,
            seed=4,
            max_tokens=200,
            extra_body=NO_THINKING,
        )
        calls = reply.choices[0].message.tool_calls or []
        assert calls and {call.function.name for call in calls} == {"get_time"}
        if not parallel:
            assert len(calls) == 1
        for call in calls:
            assert json.loads(call.function.arguments)["zone"] in ("utc", "cet")


def test_auto_leaves_the_model_free_and_a_call_it_did_not_make_is_text(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, temperature=0, max_tokens=8, extra_body=NO_THINKING
    )
    plain = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="none",
        temperature=0,
        max_tokens=8,
        extra_body=NO_THINKING,
    )
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].finish_reason == "length"
    assert plain.choices[0].message.content is not None


def thought_reply(
    client: openai.OpenAI, thinking: bool, closing: int, stream: bool = False, **extra: Any
) -> Any:
    """A reply asked for JSON, ``closing`` (``</think>``) pushed so a thought ends soon."""
    return client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        temperature=1,
        seed=2,
        max_tokens=200,
        logit_bias={str(closing): 7},
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}},
        stream=stream,
        extra_body={"chat_template_kwargs": {"enable_thinking": thinking}, **extra},
    )


def test_thinking_on_and_off_with_the_thought_apart(server: ServedDaemon, client: openai.OpenAI) -> None:
    closing = token_of(server, "</think>")
    on = thought_reply(client, True, closing).choices[0]
    thought = on.message.model_extra["reasoning_content"]
    assert thought and "</think>" not in thought and on.finish_reason == "stop"
    jsonschema.validate(json.loads(on.message.content), ANSWER)
    off = thought_reply(client, False, closing).choices[0]
    assert off.message.model_extra["reasoning_content"] is None and off.finish_reason == "stop"
    jsonschema.validate(json.loads(off.message.content), ANSWER)
    pieces: dict[str, str] = {"reasoning_content": "", "content": ""}
    for chunk in thought_reply(client, True, closing, stream=True):
        for choice in chunk.choices:
            pieces["content"] += choice.delta.content or ""
            pieces["reasoning_content"] += (choice.delta.model_extra or {}).get("reasoning_content") or ""
    assert pieces == {"reasoning_content": thought, "content": on.message.content}


def test_reasoning_effort_is_the_thinking_switch(client: openai.OpenAI, server: ServedDaemon) -> None:
    def sha(**extra: Any) -> str:
        body = {"model": MODEL, "messages": ASK, "max_tokens": 6, "temperature": 0, **extra}
        return str(
            httpx.post(server.url() + "/v1/chat/completions", json=body, timeout=60).json()["tfd"][
                "token_sha"
            ]
        )

    assert sha(reasoning_effort="none") == sha(**NO_THINKING) != sha()
    assert sha(reasoning_effort="high") == sha() == sha(chat_template_kwargs={"enable_thinking": True})
    clash = httpx.post(
        server.url() + "/v1/chat/completions",
        json={"model": MODEL, "messages": ASK, "reasoning_effort": "low", **NO_THINKING},
        timeout=60,
    )
    assert clash.status_code == 400 and clash.json()["error"]["param"] == "reasoning_effort"


def test_a_next_turn_without_the_thought_resumes_from_before_the_last_generation_prompt(
    server: ServedDaemon, client: openai.OpenAI
) -> None:
    def counted(messages: Any, generation: bool) -> int:
        return int(
            httpx.post(
                server.url() + "/tokenize",
                json={"messages": messages, "add_generation_prompt": generation},
                timeout=30,
            ).json()["count"]
        )

    # a system message as long as puts the prompt's last chunk end after ``<think>``: the state kept
    # there holds the thought's opening, which the next turn does not have
    for words in range(100, 200):
        first_turn: Any = [{"role": "system", "content": "Be brief" + " ok" * words}, *ASK]
        before, whole = counted(first_turn, False), counted(first_turn, True)
        if (whole - 1) % 64 == 0:
            break
    assert (whole - 1) % 64 == 0 and rendered(server, first_turn).endswith("<think>\n")
    closing = token_of(server, "</think>")
    first = client.chat.completions.create(
        model=MODEL,
        messages=first_turn,
        temperature=1,
        seed=3,
        max_tokens=120,
        logit_bias={str(closing): 4},
        response_format={"type": "json_object"},
    )
    said = first.choices[0].message
    assert said.model_extra["reasoning_content"]
    second: Any = [
        *first_turn,
        {
            "role": "assistant",
            "content": said.content,
            "reasoning_content": said.model_extra["reasoning_content"],
        },
        {"role": "user", "content": "And tomorrow?"},
    ]
    assert "<think>" not in rendered(server, second).split("<|im_start|>assistant")[1]  # the thought dropped
    body = {"model": MODEL, "messages": second, "max_tokens": 6, "temperature": 0}
    resumed = httpx.post(server.url() + "/v1/chat/completions", json=body, timeout=60).json()
    fresh = httpx.post(
        server.url() + "/v1/chat/completions", json={**body, "cache": False}, timeout=60
    ).json()
    assert resumed["usage"]["prompt_tokens_details"]["cached_tokens"] == before // 64 * 64 > 0
    assert resumed["tfd"]["token_sha"] == fresh["tfd"]["token_sha"]


def bounded_schemas() -> st.SearchStrategy[dict[str, Any]]:
    """Schemas whose instances are bounded (strings, arrays, integers), so a random model's reply ends."""
    leaves = st.sampled_from(
        [
            {"type": "string", "maxLength": 6},
            {"type": "integer", "minimum": -5, "maximum": 50},
            {"type": "boolean"},
            {"enum": ["red", "green", 3]},
            {"type": "null"},
        ]
    )

    def objects(inner: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
        fields = st.dictionaries(
            st.sampled_from(["a", "b", "name", "x_y", "Ünï"]), inner, min_size=1, max_size=3
        )
        return fields.flatmap(
            lambda props: st.sets(st.sampled_from(sorted(props))).map(
                lambda required: {
                    "type": "object",
                    "properties": props,
                    "required": sorted(required),
                    "additionalProperties": False,
                }
            )
        )

    arrays = st.builds(
        lambda items, most: {"type": "array", "items": items, "maxItems": most}, leaves, st.integers(0, 3)
    )
    return objects(st.one_of(leaves, arrays, objects(leaves)))


@settings(
    max_examples=20, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
@given(schema=bounded_schemas(), seed=st.one_of(st.none(), st.integers(0, 1000)))
def test_json_schema_replies_validate(
    client: openai.OpenAI, schema: dict[str, Any], seed: int | None
) -> None:
    sampling: Any = {"temperature": 0} if seed is None else {"temperature": 1, "seed": seed}
    reply = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        max_tokens=400,
        extra_body=NO_THINKING,
        **sampling,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "s", "schema": schema, "strict": True},
        },
    )
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content or ""), schema)


def test_the_conformance_kits_tool_rows_hold(server: ServedDaemon) -> None:
    from tfd.conformance.client import Client
    from tfd.conformance.gates import PROFILES
    from tfd.conformance.tool_gate import ToolGate

    rows = ToolGate(Client(server.url()), PROFILES["quick"]).rows()
    assert {row.key["check"] for row in rows} == {"repeat", "concurrent", "drafted", "resumed"}
    assert [row.detail for row in rows if not row.ok] == []

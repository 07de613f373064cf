"""The OpenAPI 3.1 description of the HTTP API, served at ``/openapi.json``.

Built from the bounds ``tfd.server.schema`` reads requests with (its ``INTEGERS``, ``NUMBERS``,
``SWITCHES``, roles, stop and logprob limits), so the description and the server cannot drift
apart on them; what a JSON Schema cannot say (a prompt's length against the context, token ids
against the vocabulary, what the chat template accepts) is said in the descriptions, and answered
400 by name. Integers are JSON numbers without a fraction (``1.0`` is refused where ``1`` is
asked). Pure data: no I/O.
"""

from __future__ import annotations

from typing import Any

from tfd import __version__
from tfd.server.access import CLIENT_ID, HEADER
from tfd.server.schema import (
    BIAS_BOUND,
    COMPLETION_LOGPROBS,
    EFFORTS,
    INTEGERS,
    MAX_BIASED,
    MAX_STOPS,
    NUMBERS,
    ROLES,
    SWITCHES,
    TEMPLATE_ARGUMENTS,
    TOKEN_KEY,
)
from tfd.server.tool_fields import NAME
from tfd.server.unsupported import CHAT, COMPLETIONS, IGNORED, RULES

JSON = "application/json"
SWITCH_HELP = {
    "stream": "Send the reply as server-sent events, ending with `data: [DONE]`.",
    "ignore_eos": "Keep drawing past the model's end-of-sequence tokens, up to max_tokens.",
    "return_token_ids": "Add the prompt's and the reply's token ids to the reply.",
    "draft": "Verify drafts from the model's MTP head (the same tokens either way); false: decode serially.",
    "cache": "Resume from and keep prompt states; false: prefill as a server without a prompt cache would.",
}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` or null: the server reads a null field as one left out."""
    return {"anyOf": [schema, {"type": "null"}]}


def _integer(low: int, high: int | None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "minimum": low}
    if high is not None:
        schema["maximum"] = high
    return schema


def _token_id(vocab: int | None) -> dict[str, Any]:
    """A token id of a vocabulary of ``vocab`` (None: any natural number)."""
    return _integer(0, None if vocab is None else vocab - 1)


def _number(low: float, high: float, low_open: bool) -> dict[str, Any]:
    return {"type": "number", ("exclusiveMinimum" if low_open else "minimum"): low, "maximum": high}


def common_fields() -> dict[str, Any]:
    """The fields both generating routes read."""
    fields: dict[str, Any] = {
        "model": _nullable({"type": "string", "description": "The served model's name (GET /v1/models); "
                                                             "another is answered 404."}),
        "max_tokens": _nullable({**_integer(*INTEGERS["max_tokens"]), "description":
                                 "Tokens to draw at most; with the prompt within the server's context."}),
        "stop": _nullable({"anyOf": [{"type": "string", "minLength": 1},
                                     {"type": "array", "items": {"type": "string", "minLength": 1},
                                      "maxItems": MAX_STOPS}]}),
        "stream_options": _nullable({"type": "object", "properties": {
            "include_usage": {"type": "boolean"},
            "continuous_usage_stats": _nullable({"const": False, "description": "Not supported."})}}),
        "n": _nullable({**_integer(*INTEGERS["n"]), "description": "Choices, each drawn with its own key: "
                        "choice i is the reply the request gives with n 1 and seed seed + i (without a "
                        "seed: the prompt's plus i); the prompt is prefilled once."}),
        "best_of": _nullable({"const": 1}),
        "top_k": _nullable({**_integer(*INTEGERS["top_k"]), "description": "0 or -1: no cut."}),
        "seed": _nullable({**_integer(*INTEGERS["seed"]),
                           "description": "Keys the draw: the same seed, the same tokens."}),
        "min_tokens": _nullable({**_integer(*INTEGERS["min_tokens"]), "description":
                                 "Tokens drawn before an end-of-sequence token may be drawn (stop "
                                 "strings still end the reply; so does max_tokens)."}),
        "logit_bias": _nullable({"type": "object", "maxProperties": MAX_BIASED,
                                 "propertyNames": {"type": "string", "pattern": TOKEN_KEY},
                                 "additionalProperties": _number(-BIAS_BOUND, BIAS_BOUND, False),
                                 "description": "Added to those tokens' logits before the draw (their "
                                                "log-probabilities stay the model's); keys are token ids "
                                                "of the vocabulary, another is refused (400)."}),
    }
    for name, (low, high, low_open) in NUMBERS.items():
        fields[name] = _nullable(_number(low, high, low_open))
    for name in SWITCHES:
        fields[name] = _nullable({"type": "boolean", "description": SWITCH_HELP[name]})
    return {**fields, **structured_fields()}


def unsupported_fields(route: str) -> dict[str, Any]:
    """The fields ``route`` refuses unless they change nothing (``tfd.server.unsupported``), and
    those it ignores."""
    ignored = {"description": "Ignored: it does not change the reply."}
    fields: dict[str, Any] = {name: dict(ignored) for name in IGNORED}
    for rule in RULES:
        if route in rule.routes:
            fields[rule.name] = _nullable({**rule.accepts, "description": f"Not supported ({rule.what}): "
                                           f"only a value that changes nothing, or left out."})
    return fields


def message_schema() -> dict[str, Any]:
    text_part = {"type": "object", "required": ["type", "text"],
                 "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
    content = {"anyOf": [{"type": "string"}, {"type": "array", "items": text_part}]}
    call = {"type": "object", "required": ["function"], "properties": {"function": {
        "type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"},
            "arguments": {"type": "string", "description": "A JSON object, as the reply gave it."}}}}}
    return {"type": "object", "required": ["role"], "properties": {
        "tool_calls": _nullable({"type": "array", "items": call, "description": "An assistant's calls."}),
        "tool_call_id": {"type": "string", "description": "A tool's result: the call it answers."},
    }, "anyOf": [
        {"required": ["content"], "properties": {"role": {"enum": sorted(ROLES)}, "content": content}},
        {"properties": {"role": {"const": "assistant"}, "content": {"type": "null"}}},
    ]}


def structured_fields() -> dict[str, Any]:
    """The structured outputs both routes read (``tfd.server.structured``): one of them at most."""
    schema = {"type": "object", "description": "A JSON Schema (what llguidance implements; another "
                                               "keyword is refused, 400)."}
    choice = {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}}
    regex = {"type": "string", "minLength": 1, "description": "A regular expression (Rust's syntax)."}
    spec = {"type": "object", "required": ["schema"], "properties": {
        "name": {"type": "string"}, "schema": schema, "strict": _nullable({"type": "boolean"})}}
    kinds = [{"type": "object", "required": ["type"],
              "properties": {"type": {"enum": ["text", "json_object"]}}},
             {"type": "object", "required": ["type", "json_schema"],
              "properties": {"type": {"const": "json_schema"}, "json_schema": spec}}]
    one = {"anyOf": [{"type": "object", "required": [name], "properties": {name: value},
                      "additionalProperties": False}
                     for name, value in (("json", schema), ("json_object", {"const": True}), ("regex", regex),
                                         ("choice", choice))]}
    said = ("The reply follows it (a thinking model's after its thought), and parses and validates; "
            "at most one of response_format, guided_json, guided_regex, guided_choice, structured_outputs.")
    return {
        "response_format": _nullable({"anyOf": kinds, "description": "json_object: a JSON object; "
                                      "json_schema: JSON valid against the schema (strict: no properties "
                                      "past those named). " + said}),
        "guided_json": _nullable({**schema, "description": "vLLM's: a JSON Schema. " + said}),
        "guided_regex": _nullable({**regex, "description": "vLLM's: text matching it. " + said}),
        "guided_choice": _nullable({**choice, "description": "vLLM's: one of the strings. " + said}),
        "structured_outputs": _nullable({**one, "description": "vLLM's: one of json, json_object, regex, "
                                         "choice. " + said}),
    }


def tool_fields() -> dict[str, Any]:
    """``tools``, ``tool_choice``, ``parallel_tool_calls`` (``tfd.server.tool_fields``)."""
    function = {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "pattern": f"^{NAME.pattern}(?!\\n)$"}, "description": {"type": "string"},
        "parameters": {"type": "object", "description": "A JSON Schema of an object."},
        "strict": _nullable({"type": "boolean"})}}
    tool = {"type": "object", "required": ["type", "function"],
            "properties": {"type": {"const": "function"}, "function": function}}
    named = {"type": "object", "required": ["type", "function"], "properties": {
        "type": {"const": "function"},
        "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}}
    return {
        "tools": _nullable({"type": "array", "items": tool, "description": "Functions the model may call, "
                            "given to the chat template; a template that takes none refuses them (400). "
                            "Calls come back as message.tool_calls (streamed: delta.tool_calls)."}),
        "tool_choice": _nullable({"anyOf": [{"enum": ["none", "auto", "required"]}, named], "description":
                                  "none: no tools offered; auto: the model chooses; required or a named "
                                  "function: the reply is a call, valid against the function's "
                                  "parameters."}),
        "parallel_tool_calls": _nullable({"type": "boolean", "description": "false: one call at most."}),
        "reasoning_effort": _nullable({"enum": list(EFFORTS), "description":
                                       "The template's thinking switch: none turns thinking off, any other "
                                       "effort on; a template without the switch refuses it (400)."}),
    }


def chat_request() -> dict[str, Any]:
    return {"type": "object", "required": ["messages"], "properties": {
        **common_fields(), **unsupported_fields(CHAT), **tool_fields(),
        "messages": {"type": "array", "minItems": 1, "items": message_schema(),
                     "description": "Rendered by the model's chat template, which may refuse them (400)."},
        "max_completion_tokens": _nullable(_integer(*INTEGERS["max_completion_tokens"])),
        "logprobs": _nullable({"type": "boolean"}),
        "top_logprobs": _nullable({**_integer(*INTEGERS["top_logprobs"]),
                                   "description": "Needs logprobs: true."}),
        "chat_template_kwargs": _nullable({"type": "object", "propertyNames": {"not": {"enum": sorted(
            TEMPLATE_ARGUMENTS)}}, "description": "More arguments to the chat template (tools, "
                                                  "enable_thinking...)."}),
    }, "anyOf": [  # top_logprobs only with logprobs: true
        {"not": {"required": ["top_logprobs"]}},
        {"properties": {"top_logprobs": {"type": "null"}}},
        {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
    ]}


def completion_request(vocab: int | None = None) -> dict[str, Any]:
    """``vocab``: the served model's vocabulary size, the bound of token ids (None: unbounded)."""
    token_ids = {"type": "array", "minItems": 1, "items": _token_id(vocab), "description": "Token ids."}
    text = {"type": "string", "minLength": 1}
    batch = {"type": "array", "minItems": 1, "maxItems": 1, "items": {"anyOf": [text, token_ids]}}
    prompt = {"anyOf": [text, token_ids, batch],
              "description": "One prompt: text, token ids, or a batch of exactly one of them."}
    return {"type": "object", "required": ["prompt"], "properties": {
        **common_fields(), **unsupported_fields(COMPLETIONS), "prompt": prompt,
        "logprobs": _nullable(_integer(*COMPLETION_LOGPROBS)),
        "echo": _nullable({"const": False, "description": "Not supported."}),
    }}


def _answers(ok: dict[str, Any], *statuses: int) -> dict[str, Any]:
    answers: dict[str, Any] = {"200": ok}
    for status in statuses:
        answers[str(status)] = {"description": STATUS_HELP[status],
                                "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}}}
    return answers


STATUS_HELP = {400: "Refused: error.param names the field at fault.", 401: "No valid API key.",
               404: "Another model than the one served.", 413: "A body over 32 MiB.",
               503: "Loading, draining, or the queue full (Retry-After)."}
GENERATING = (400, 401, 404, 413, 503)


def description(vocab: int | None = None) -> dict[str, Any]:
    """The whole OpenAPI document; ``vocab`` bounds token ids (the served model's)."""
    def generated(kind: str, schema: dict[str, Any]) -> dict[str, Any]:
        responses = _answers({"description": f"A {kind} (JSON), or server-sent events when stream is true.",
                              "content": {JSON: {"schema": {"type": "object"}},
                                          "text/event-stream": {"schema": {"type": "string"}}}}, *GENERATING)
        id_header = {"description": "The request's id: the reply's id, what admin lanes shows and cancel "
                                    "takes (absent on a refusal before it got one: no API key, or a "
                                    "malformed x-request-id).",
                     "schema": {"type": "string"}}
        for response in responses.values():
            response["headers"] = {HEADER: id_header}
        client_id = {"name": HEADER, "in": "header", "required": False,
                     "description": "The base of the request's id (chatcmpl-ID, cmpl-ID; -2, -3... while "
                                    "one of that id still runs); another form is refused 400.",
                     "schema": {"type": "string", "pattern": f"^{CLIENT_ID.pattern}$"}}
        body = {"required": True, "content": {JSON: {"schema": schema}}}
        return {"parameters": [client_id], "requestBody": body, "responses": responses}

    json_ok = {"description": "OK", "content": {JSON: {"schema": {"type": "object"}}}}
    text = {"description": "Prometheus text.", "content": {"text/plain": {"schema": {"type": "string"}}}}
    this = {**json_ok, "description": "This document."}
    return {
        "openapi": "3.1.0",
        "info": {"title": "tfd", "version": __version__,
                 "description": "An OpenAI-compatible API for hybrid linear-attention models."},
        "paths": {
            "/v1/chat/completions": {"post": generated("chat.completion", chat_request())},
            "/v1/completions": {"post": generated("text_completion", completion_request(vocab))},
            "/v1/models": {"get": {"responses": _answers(json_ok, 401, 503)}},
            "/v1/models/{model}": {"get": {"parameters": [{"name": "model", "in": "path", "required": True,
                                                           "schema": {"type": "string"}}],
                                           "responses": _answers(json_ok, 401, 404, 503)}},
            "/tokenize": {"post": {"requestBody": {"required": True, "content": {JSON: {"schema": {
                "type": "object", "description": "Either prompt (a string) or messages, as a chat request "
                                                 "(add_generation_prompt: a boolean, true by default)."}}}},
                "responses": _answers(json_ok, 400, 401, 503)}},
            "/detokenize": {"post": {"requestBody": {"required": True, "content": {JSON: {"schema": {
                "type": "object", "required": ["tokens"],
                "properties": {"tokens": {"type": "array", "items": _token_id(vocab)}}}}}},
                "responses": _answers(json_ok, 400, 401, 503)}},
            "/health": {"get": {"responses": {"200": json_ok, "503": {"description": "Not ready."}}}},
            "/metrics": {"get": {"responses": {"200": text, "401": {"description": STATUS_HELP[401]}}}},
            "/openapi.json": {"get": {"responses": _answers(this, 401, 503)}},
        },
        "components": {"schemas": {"Error": {"type": "object", "required": ["error"], "properties": {
            "error": {"type": "object", "required": ["message", "type", "param", "code"], "properties": {
                "message": {"type": "string"}, "type": {"type": "string"},
                "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}}},
    }

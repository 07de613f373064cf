"""OpenAI request bodies, read strictly: every field of the wrong type or out of range is refused
with a 400 that names it (``param``), before anything is queued.

Fields tfd does not implement and that would change the reply (batches of prompts, and
``tfd.server.unsupported``'s: audio, beam search...) are refused by name rather than ignored;
fields that do not change it (``user``, ``metadata``...) are ignored. Structured outputs are read
by ``tfd.server.structured``, tools by ``tfd.server.tool_fields``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, TypeVar

import attrs

from tfd.engine.request import Sampling
from tfd.server.bad_request import BadRequest
from tfd.server.structured import Constraint, read_constraint
from tfd.server.tool_fields import Tools, read_tools
from tfd.server.unsupported import CHAT, COMPLETIONS, unsupported

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
MAX_STOPS = 16
MAX_CHOICES = 64  # n: each choice is a lane of its own
MAX_TOP_LOGPROBS = 20
MAX_BIASED = 1024  # tokens a logit_bias may name
BIAS_BOUND = 100.0  # a logit_bias value lies within +-this (OpenAI's bounds)
# a logit_bias key: a token id in decimal, at most 10 digits (past any vocabulary well before)
TOKEN_KEY = "^(0|[1-9][0-9]{0,9})(?!\\n)$"
SEED_MASK = (1 << 63) - 1
T = TypeVar("T")
# the bounds each field is read with, (lowest, highest or None); ``tfd.server.description`` states them
INTEGERS: dict[str, tuple[int, int | None]] = {
            "max_tokens": (1, None), "max_completion_tokens": (1, None), "n": (1, MAX_CHOICES),
            "best_of": (1, None),
            "top_k": (-1, None), "seed": (-(1 << 63), (1 << 64) - 1), "top_logprobs": (0, MAX_TOP_LOGPROBS),
            "min_tokens": (0, None)}
COMPLETION_LOGPROBS = (0, MAX_TOP_LOGPROBS)  # /v1/completions' logprobs: how many alternatives
# (lowest, highest, whether the lowest itself is refused)
NUMBERS = {"temperature": (0.0, 2.0, False), "top_p": (0.0, 1.0, True), "min_p": (0.0, 1.0, False),
           "frequency_penalty": (-2.0, 2.0, False), "presence_penalty": (-2.0, 2.0, False),
           "repetition_penalty": (0.0, 10.0, True)}
TEMPLATE_ARGUMENTS = frozenset({"messages", "add_generation_prompt"})  # chat_template_kwargs may not set
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")  # OpenAI's reasoning_effort values
SWITCHES = ("stream", "ignore_eos", "return_token_ids", "draft", "cache")  # booleans both routes read


@attrs.frozen
class Common:
    """The fields chat and completions share."""

    model: str | None
    max_tokens: int | None
    sampling: Sampling
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    n: int  # choices, each drawn with its own key
    min_tokens: int  # tokens drawn before an end-of-sequence token may be
    ignore_eos: bool
    return_token_ids: bool
    draft: bool
    cache: bool  # resume from and keep prompt states; False: prefilled as on a server without a cache
    constraint: Constraint | None = None  # the structured output asked for (response_format...)


@attrs.frozen
class ChatBody:
    common: Common
    messages: tuple[dict[str, Any], ...]
    template_kwargs: Mapping[str, Any]
    tools: Tools | None = None
    reasoning_effort: str | None = None  # one of EFFORTS: the template's thinking switch decides


@attrs.frozen
class CompletionBody:
    common: Common
    prompt: str | tuple[int, ...]


def chat_body(body: object) -> ChatBody:
    fields = _object(body)
    messages = fields.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty array of messages", "messages")
    read = [_message(message, f"messages[{i}]") for i, message in enumerate(messages)]
    kwargs = _default(fields.get("chat_template_kwargs"), {})
    if not isinstance(kwargs, dict):
        raise BadRequest("chat_template_kwargs must be an object", "chat_template_kwargs")
    for name in TEMPLATE_ARGUMENTS & kwargs.keys():
        raise BadRequest(f"chat_template_kwargs may not set {name}: the request gives it",
                         f"chat_template_kwargs.{name}")
    logprobs = _bool(fields, "logprobs")
    top = _int(fields, "top_logprobs")
    if top is not None and not logprobs:
        raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
    limit = _default(_int(fields, "max_completion_tokens"), _int(fields, "max_tokens"))
    effort = fields.get("reasoning_effort")
    if effort is not None and effort not in EFFORTS:
        raise BadRequest(f"reasoning_effort must be one of {', '.join(EFFORTS)}", "reasoning_effort")
    common = _common(fields, CHAT, limit, (top or 0) if logprobs else None)
    return ChatBody(common, tuple(read), kwargs, read_tools(fields), effort)


def completion_body(body: object) -> CompletionBody:
    fields = _object(body)
    prompt = fields.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one is one prompt
    if isinstance(prompt, str):
        read: str | tuple[int, ...] = prompt
    elif isinstance(prompt, list) and (ids := token_ids(prompt)) is not None:
        read = ids
    elif isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str | list) for p in prompt):
        raise BadRequest("prompt: batches are not supported; send one prompt per request", "prompt")
    else:
        raise BadRequest("prompt must be a string or a non-empty array of token ids", "prompt")
    if _bool(fields, "echo"):
        raise BadRequest("echo is not supported", "echo")
    top = _int(fields, "logprobs", COMPLETION_LOGPROBS)
    return CompletionBody(_common(fields, COMPLETIONS, _int(fields, "max_tokens"), top), read)


def _common(fields: dict[str, Any], route: str, max_tokens: int | None, logprobs: int | None) -> Common:
    model = fields.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("model must be a string", "model")
    n = _default(_int(fields, "n"), 1)
    if _int(fields, "best_of") not in (None, 1):
        raise BadRequest("best_of must be 1", "best_of")
    refused = unsupported(fields, route)
    if refused is not None:
        raise BadRequest(refused[1], refused[0])
    top_k = _int(fields, "top_k")
    seed = _int(fields, "seed")
    sampling = Sampling(
        temperature=_default(_number(fields, "temperature"), 1.0),
        top_p=_default(_number(fields, "top_p"), 1.0),
        top_k=max(0, _default(top_k, 0)),
        min_p=_default(_number(fields, "min_p"), 0.0),
        seed=None if seed is None else seed & SEED_MASK,
        logprobs=logprobs, bias=_logit_bias(fields),
        frequency_penalty=_default(_number(fields, "frequency_penalty"), 0.0),
        presence_penalty=_default(_number(fields, "presence_penalty"), 0.0),
        repetition_penalty=_default(_number(fields, "repetition_penalty"), 1.0))
    options = _default(fields.get("stream_options"), {})
    if not isinstance(options, dict):
        raise BadRequest("stream_options must be an object", "stream_options")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise BadRequest("stream_options.include_usage must be a boolean", "stream_options.include_usage")
    if options.get("continuous_usage_stats") not in (None, False):  # vLLM's: usage in every chunk
        raise BadRequest("stream_options.continuous_usage_stats is not supported; leave it out or false",
                         "stream_options.continuous_usage_stats")
    min_tokens = _default(_int(fields, "min_tokens"), 0)  # past max_tokens: no end token at all
    constraint = read_constraint(fields)
    return Common(model=model, max_tokens=max_tokens, sampling=sampling, stop=_stop(fields),
                  stream=_bool(fields, "stream"), include_usage=include_usage, n=n, min_tokens=min_tokens,
                  ignore_eos=_bool(fields, "ignore_eos"), return_token_ids=_bool(fields, "return_token_ids"),
                  draft=_default(_optional_bool(fields, "draft"), True),
                  cache=_default(_optional_bool(fields, "cache"), True), constraint=constraint)


def _object(body: object) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _message(message: object, where: str) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise BadRequest(f"{where} must be an object", where)
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise BadRequest(f"{where}.role must be one of {', '.join(sorted(ROLES))}", f"{where}.role")
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise BadRequest(f"{where}.content[{j}] must be a text part: tfd reads text only",
                                 f"{where}.content[{j}]")
            texts.append(part["text"])
        content = "".join(texts)
    elif content is None and role == "assistant":
        content = ""
    elif not isinstance(content, str):
        raise BadRequest(f"{where}.content must be a string or an array of text parts", f"{where}.content")
    read = {**message, "content": content}
    if role == "assistant" and message.get("tool_calls") is not None:
        read["tool_calls"] = _tool_calls(message["tool_calls"], f"{where}.tool_calls")
    if role == "tool" and not isinstance(message.get("tool_call_id", ""), str):
        raise BadRequest(f"{where}.tool_call_id must be a string", f"{where}.tool_call_id")
    return read


def _tool_calls(calls: object, where: str) -> list[dict[str, Any]]:
    """An assistant message's calls as a template reads them: each call's ``arguments`` (JSON text,
    as OpenAI sends them) parsed into the object they hold."""
    if not isinstance(calls, list):
        raise BadRequest(f"{where} must be an array of tool calls", where)
    read = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRequest(f"{where}[{i}] must be a call with a function name", f"{where}[{i}].function")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                raise BadRequest(f"{where}[{i}].function.arguments is not JSON",
                                 f"{where}[{i}].function.arguments") from None
        if not isinstance(arguments, dict):
            raise BadRequest(f"{where}[{i}].function.arguments must be a JSON object",
                             f"{where}[{i}].function.arguments")
        read.append({**call, "function": {**function, "arguments": arguments}})
    return read


def _logit_bias(fields: dict[str, Any]) -> tuple[tuple[int, float], ...]:
    """``logit_bias``: token ids (decimal keys) to values within +-BIAS_BOUND, at most MAX_BIASED; a
    token past the vocabulary is refused where the vocabulary is known (``check_bias``)."""
    bias = fields.get("logit_bias")
    if bias is None:
        return ()
    if not isinstance(bias, dict) or len(bias) > MAX_BIASED:
        raise BadRequest(f"logit_bias must be an object of at most {MAX_BIASED} token ids", "logit_bias")
    read = []
    for key, value in bias.items():
        if not (isinstance(key, str) and 0 < len(key) <= 10 and key.isascii() and key.isdigit()
                and (key == "0" or key[0] != "0")):
            shown = key if len(str(key)) <= 24 else f"{str(key)[:20]}..."
            raise BadRequest(f"logit_bias keys are token ids in decimal (10 digits at most), not {shown!r}",
                             "logit_bias")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                or abs(value) > BIAS_BOUND:
            raise BadRequest(f"logit_bias values are numbers from {-BIAS_BOUND:g} to {BIAS_BOUND:g}",
                             "logit_bias")
        read.append((int(key), float(value)))
    return tuple(sorted(read))


def check_bias(sampling: Sampling, vocab: int) -> None:
    """Refuse a logit bias naming a token past a vocabulary of ``vocab``."""
    if sampling.bias and sampling.bias[-1][0] >= vocab:
        raise BadRequest(f"logit_bias names token {sampling.bias[-1][0]}, past the vocabulary of {vocab}",
                         "logit_bias")


def _stop(fields: dict[str, Any]) -> tuple[str, ...]:
    stop = fields.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest("stop must be a non-empty string or an array of them", "stop")
    if len(stops) > MAX_STOPS:
        raise BadRequest(f"stop holds at most {MAX_STOPS} strings", "stop")
    return tuple(stops)


def token_ids(values: list[Any]) -> tuple[int, ...] | None:
    """``values`` as token ids when it is a non-empty list of integers (JSON's: ``3.0`` too) none below
    zero, else None. A prompt of JSON ints is checked at C speed (a 30,000-token body took 4 ms in
    Python's loop on a slow host, in front of its first token)."""
    if not values:
        return None
    if set(map(type, values)) == {int}:  # bools and floats are other types
        return tuple(values) if min(values) >= 0 else None
    if all(_is_int(t) and t >= 0 for t in values):
        return tuple(int(t) for t in values)
    return None


def _is_int(value: object) -> bool:
    """An integer as JSON has them: ``3`` or ``3.0`` (JSON Schema's integer), not ``true``."""
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, int) and not isinstance(value, bool)


def _int(fields: dict[str, Any], name: str, bounds: tuple[int, int | None] | None = None) -> int | None:
    low, high = bounds or INTEGERS[name]
    value = fields.get(name)
    if value is None:
        return None
    if not _is_int(value) or value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise BadRequest(f"{name} must be an integer {bound}", name)
    return int(value)


def _number(fields: dict[str, Any], name: str) -> float | None:
    low, high, low_open = NUMBERS[name]
    value = fields.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value > high or value < low or (low_open and value == low):
        side = "above" if low_open else "from"
        raise BadRequest(f"{name} must be a number {side} {low:g} to {high:g}", name)
    return float(value)


def _bool(fields: dict[str, Any], name: str) -> bool:
    return bool(_optional_bool(fields, name))


def _optional_bool(fields: dict[str, Any], name: str) -> bool | None:
    value = fields.get(name)
    if value is not None and not isinstance(value, bool):
        raise BadRequest(f"{name} must be a boolean", name)
    return value


def _default(value: T | None, default: T) -> T:
    return default if value is None else value

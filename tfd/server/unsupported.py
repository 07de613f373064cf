"""Request fields tfd does not honour yet: refused by name unless they hold a value that changes nothing.

OpenAI's chat and completions requests, and the extensions clients of vLLM and SGLang send, carry
fields that would change a reply (audio, beam search...). Until tfd honours one, a request
that sets it is refused with a 400 naming it (``param``), never served as if it were not there; the
value that changes nothing (an empty list, ``"none"``, or null: the field left out) is accepted.
Each rule's accepted values are a small JSON Schema, read here and served as is in the OpenAPI
description (``tfd.server.description``), so the two cannot drift. Fields that never change a reply
(``user``, ``metadata``, ``store``, ...) are ``IGNORED``. Pure data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

CHAT, COMPLETIONS = "chat", "completions"
BOTH = frozenset({CHAT, COMPLETIONS})
NOTHING: dict[str, Any] = {"type": "null"}  # only left out


@attrs.frozen
class Unsupported:
    """``name`` is not honoured (``what`` says what tfd does not do); a request may hold only the
    values ``accepts`` (a JSON Schema of the subset ``matches`` reads) or null; ``neutral``: those
    values in words, for the refusal."""

    name: str
    what: str
    accepts: dict[str, Any] = NOTHING
    neutral: str = ""
    routes: frozenset[str] = BOTH

    def problem(self, value: object) -> str | None:
        """The refusal's words for ``value``, or None when it changes nothing."""
        if value is None or matches(value, self.accepts):
            return None
        return f"{self.name} is not supported: {self.what}; leave it out{self.neutral}"


RULES = (
    Unsupported("guided_grammar", "grammars of the request's own (JSON Schema, regex and choice are)"),
    Unsupported("guided_whitespace_pattern", "whitespace of the request's own in structured outputs (tfd "
                "lays JSON out as json.dumps does)"),
    Unsupported("guided_decoding_backend", "a choice of grammar engine (tfd's is llguidance)"),
    Unsupported("functions", "function calls", {"type": "array", "maxItems": 0}, " or empty",
                frozenset({CHAT})),
    Unsupported("function_call", "function calls", {"enum": ["none", "auto"]}, ' or "none"',
                frozenset({CHAT})),
    Unsupported("verbosity", "a verbosity switch", routes=frozenset({CHAT})),
    Unsupported("modalities", "output other than text", {"type": "array", "items": {"const": "text"}},
                ' or ["text"]', frozenset({CHAT})),
    Unsupported("audio", "audio output", routes=frozenset({CHAT})),
    Unsupported("web_search_options", "web search", routes=frozenset({CHAT})),
    Unsupported("moderation", "moderation", routes=frozenset({CHAT})),
    Unsupported("suffix", "insertion", {"const": ""}, ' or ""', frozenset({COMPLETIONS})),
    # vLLM's and SGLang's extensions that would change the reply
    Unsupported("stop_token_ids", "stop tokens of the request's own", {"type": "array", "maxItems": 0},
                " or empty"),
    Unsupported("include_stop_str_in_output", "stop strings kept in the text", {"const": False},
                " or false"),
    Unsupported("skip_special_tokens", "special tokens in the text", {"const": True}, " or true"),
    Unsupported("spaces_between_special_tokens", "special tokens in the text", {"const": True}, " or true"),
    Unsupported("allowed_token_ids", "a token allow-list"),
    Unsupported("bad_words", "banned words", {"type": "array", "maxItems": 0}, " or empty"),
    Unsupported("truncate_prompt_tokens", "prompt truncation"),
    Unsupported("prompt_logprobs", "the prompt's log-probabilities"),
    Unsupported("use_beam_search", "beam search", {"const": False}, " or false"),
    Unsupported("length_penalty", "beam search", {"const": 1}, " or at 1"),
    Unsupported("chat_template", "a chat template of the request's own (the server's is TF_CHAT_TEMPLATE)",
                routes=frozenset({CHAT})),
    Unsupported("continue_final_message", "continuing the last message", {"const": False}, " or false",
                frozenset({CHAT})),
    Unsupported("echo", "echoing the prompt", {"const": False}, " or false", frozenset({CHAT})),
    Unsupported("add_special_tokens", "special tokens added to the rendered prompt", {"const": False},
                " or false", frozenset({CHAT})),
)
# never change a reply: routing, caching and billing hints, the client's own labels; a prediction is
# a latency hint (the reply is the model's either way)
IGNORED = ("user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
           "prompt_cache_retention", "prompt_cache_options", "prediction")


def unsupported(fields: Mapping[str, Any], route: str) -> tuple[str, str] | None:
    """The first field of ``fields`` (a ``route`` request's) set to a value tfd does not honour:
    (its name, the refusal's words); None when there is none."""
    for rule in RULES:
        if route in rule.routes:
            problem = rule.problem(fields.get(rule.name))
            if problem is not None:
                return rule.name, problem
    return None


def matches(value: object, schema: Mapping[str, Any]) -> bool:
    """Whether ``value`` (as JSON reads it) is valid against ``schema``, of the subset the rules use:
    const, enum, type (null, boolean, array, object), maxItems, items, maxProperties, required,
    properties, additionalProperties. ValueError for another keyword: a rule outside the subset is a bug."""
    unknown = set(schema) - {"const", "enum", "type", "maxItems", "items", "maxProperties", "required",
                             "properties", "additionalProperties"}
    if unknown:
        raise ValueError(f"schema keywords outside the subset: {sorted(unknown)}")
    if "const" in schema:
        return _same(value, schema["const"])
    if "enum" in schema:
        return any(_same(value, choice) for choice in schema["enum"])
    kind = schema.get("type")
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list) and len(value) <= schema.get("maxItems", len(value)) \
            and all(matches(item, schema.get("items", {})) for item in value)
    if kind == "object":
        if not isinstance(value, dict) or len(value) > schema.get("maxProperties", len(value)):
            return False
        properties = schema.get("properties", {})
        if schema.get("additionalProperties", True) is False and set(value) - set(properties):
            return False
        return all(name in value for name in schema.get("required", ())) \
            and all(matches(value[name], sub) for name, sub in properties.items() if name in value)
    if kind is None:
        return True  # no constraint
    raise ValueError(f"schema type outside the subset: {kind}")


def _same(value: object, constant: object) -> bool:
    """JSON equality: true is not 1, 1 is 1.0."""
    if isinstance(value, bool) or isinstance(constant, bool):
        return type(value) is type(constant) and value == constant
    if isinstance(constant, int | float):
        return isinstance(value, int | float) and value == constant
    return value == constant

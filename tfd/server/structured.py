"""Structured outputs: the request fields that make a reply follow a grammar, read into one.

``response_format`` (``json_object``, ``json_schema`` with ``strict``), and the extensions vLLM's
clients send: ``guided_json``, ``guided_regex``, ``guided_choice`` and ``structured_outputs``
(``json``, ``json_object``, ``regex``, ``choice``). At most one of them; each becomes a
``Constraint``: a Lark rule body for llguidance (``%json`` for a schema, a regex, a choice of
literals). A strict schema's objects take no properties past those named (``additionalProperties:
false`` where the schema says nothing, as OpenAI's strict mode); otherwise JSON Schema's own rules
hold. JSON is laid out as ``json.dumps`` writes it (``json_rule``): no other whitespace, so a reply
cannot run on in spaces.

``grammar`` writes the whole grammar: when the reply starts inside a thought, the thought first
(any text up to and with ``</think>``, then its blank line) and the constraint after it, so a
thinking model thinks freely and answers in form.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from tfd.server.bad_request import BadRequest

THOUGHT_END = "</think>"
LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice", "structured_outputs")


@attrs.frozen
class Constraint:
    """``body``: the Lark rule the reply (after any thought) must match, ``rules`` the rules it names
    (Lark lines); ``field``: the request field it came from, named when it does not compile."""

    body: str
    field: str
    rules: str = ""


def read_constraint(fields: Mapping[str, Any]) -> Constraint | None:
    """The request's structured output; None when it asks for none. ``BadRequest`` names a malformed
    field, or the second of two given."""
    found = None
    for name in FIELDS:
        value = fields.get(name)
        if value is None:
            continue
        read = _read(name, value)
        if read is not None and found is not None:
            raise BadRequest(f"{name}: only one of {', '.join(FIELDS)} may be given", name)
        found = read or found
    return found


def _read(name: str, value: Any) -> Constraint | None:
    if name == "response_format":
        return _response_format(value)
    if name == "guided_json":
        return Constraint(_json_body(_schema(value, name), False), name)
    if name == "guided_regex":
        return Constraint(_regex_body(value, name), name)
    if name == "guided_choice":
        return Constraint(_choice_body(value, name), name)
    if not isinstance(value, dict) or len(value) != 1:
        raise BadRequest("structured_outputs must be an object of one of json, json_object, regex, choice",
                         name)
    (kind, inner), = value.items()
    where = f"{name}.{kind}"
    if kind == "json":
        return Constraint(_json_body(_schema(inner, where), False), where)
    if kind == "json_object" and inner is True:
        return Constraint(_json_body({"type": "object"}, False), where)
    if kind == "regex":
        return Constraint(_regex_body(inner, where), where)
    if kind == "choice":
        return Constraint(_choice_body(inner, where), where)
    raise BadRequest(f"{where} is not supported: json, json_object (true), regex or choice", where)


def _response_format(value: Any) -> Constraint | None:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint(_json_body({"type": "object"}, False), "response_format")
    if kind != "json_schema":
        raise BadRequest('response_format.type must be "text", "json_object" or "json_schema"',
                         "response_format.type")
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name", ""), str):
        raise BadRequest("response_format.json_schema must be an object with a name and a schema",
                         "response_format.json_schema")
    strict = spec.get("strict") or False
    if not isinstance(strict, bool):
        raise BadRequest("response_format.json_schema.strict must be a boolean",
                         "response_format.json_schema.strict")
    schema = _schema(spec.get("schema", {}), "response_format.json_schema.schema")
    return Constraint(_json_body(schema, strict), "response_format.json_schema.schema")


def _schema(value: Any, where: str) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise BadRequest(f"{where} is not JSON", where) from None
    if not isinstance(value, dict):
        raise BadRequest(f"{where} must be a JSON Schema (an object)", where)
    if not isinstance(value.get("x-guidance", {}), dict):
        raise BadRequest(f"{where}: x-guidance must be an object of llguidance's JSON options", where)
    return value


def _json_body(schema: dict[str, Any], strict: bool) -> str:
    return json_rule(closed(schema) if strict else schema)


def json_rule(schema: Any) -> str:
    """A Lark rule body matching JSON valid against ``schema``, laid out as Python's ``json.dumps``
    writes it (``", "``, ``": "``, no other whitespace: a model cannot run on in spaces)."""
    if isinstance(schema, dict):
        given = schema.get("x-guidance")
        schema = {**schema, "x-guidance": {**LAYOUT, **(given if isinstance(given, dict) else {})}}
    return "%json " + json.dumps(schema, ensure_ascii=False, separators=(",", ":"))


def closed(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object schema that says nothing of
    it (a copy; strict mode)."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    copy = {key: closed(value) if key not in ("const", "enum", "default", "examples") else value
            for key, value in schema.items()}
    if (schema.get("type") == "object" or "properties" in schema) and "additionalProperties" not in schema:
        copy["additionalProperties"] = False
    if isinstance(schema.get("properties"), dict):  # property names are not schemas: copied as they are
        copy["properties"] = {name: closed(sub) for name, sub in schema["properties"].items()}
    return copy


def _regex_body(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{where} must be a non-empty regular expression", where)
    escaped, at = [], 0
    while at < len(value):  # a slash ends a Lark regex: escape the bare ones
        char = value[at]
        if char == "\\" and at + 1 < len(value):
            escaped.append(value[at:at + 2])
            at += 2
            continue
        escaped.append("\\/" if char == "/" else char)
        at += 1
    return "/" + "".join(escaped) + "/"


def _choice_body(value: Any, where: str) -> str:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise BadRequest(f"{where} must be a non-empty array of non-empty strings", where)
    return " | ".join(literal(choice) for choice in value)


def grammar(constraint: Constraint, inside_thought: bool, special: Callable[[str], int | None]) -> str:
    """The whole Lark grammar of a reply that must match ``constraint`` (after its thought, when it
    starts inside one). ``special``: a text's id when it is one special token of the vocabulary,
    which a grammar must name as a token (``tag``)."""
    if not inside_thought:
        return f"start: {constraint.body}\n{constraint.rules}"
    if special(THOUGHT_END) is not None:  # text without the tag's text, then the tag's token
        thought = "THOUGHT: /(.|\\n)*/ & ~/(.|\\n)*<\\/think>(.|\\n)*/\n"
        start = f"start: THOUGHT {tag(THOUGHT_END, special)} \"\\n\\n\" answer\n"
    else:  # text up to and with the tag's first appearance
        thought = "THOUGHT: /(.|\\n)*<\\/think>/ & ~/(.|\\n)*<\\/think>(.|\\n)+/\n"
        start = "start: THOUGHT \"\\n\\n\" answer\n"
    return f"{start}answer: {constraint.body}\n{thought}{constraint.rules}"


def tag(text: str, special: Callable[[str], int | None]) -> str:
    """``text`` as a Lark grammar names it: its token (``<[id]>``) when it is one special token of the
    vocabulary (llguidance will not spell it from text), else a string literal."""
    found = special(text)
    return f"<[{found}]>" if found is not None else literal(text)


def literal(text: str) -> str:
    """``text`` as a Lark string literal (JSON's escapes, which llguidance reads)."""
    return json.dumps(text, ensure_ascii=False)

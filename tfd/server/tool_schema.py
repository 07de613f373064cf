"""A tool's parameters as the call reader and the call grammar both read them.

``inline_refs`` replaces a schema's local references (``#/$defs/NAME``, ``#/definitions/NAME``, as
pydantic writes them) by what they name, so a parameter read or constrained on its own still means
what it meant under its root; a reference that loops or names nothing is a ``ValueError``.
``written_raw`` says how the XML format writes a parameter's value: as the text itself when the value
may be a string (or its schema says nothing of its type), else as JSON, as Qwen3.5's template
renders it back; the reader parses and the grammar constrains by the same rule (``parameter_value``
reads a value back: JSON of its type, else the text). ``strict_json`` is JSON without NaN or
infinities and at most 100 deep, or ``NOT_JSON``.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

MOST_DEPTH = 16  # references followed inside one another at most (a deeper one loops)
_JSON_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (type(None), "null"),
               (list, "array"), (dict, "object"))


def inline_refs(schema: Any, root: Mapping[str, Any] | None = None, depth: int = 0) -> Any:
    """``schema`` with every local reference replaced by what it names (a copy)."""
    root = schema if root is None else root
    if isinstance(schema, list):
        return [inline_refs(item, root, depth) for item in schema]
    if not isinstance(schema, dict):
        return schema
    reference = schema.get("$ref")
    if isinstance(reference, str):
        if depth >= MOST_DEPTH:
            raise ValueError(f"the reference {reference} loops (more than {MOST_DEPTH} deep)")
        named = _resolve(reference, root)
        rest = {key: value for key, value in schema.items() if key != "$ref"}
        return inline_refs({**named, **rest}, root, depth + 1)
    return {key: value if key in ("const", "enum", "default", "examples", "$defs", "definitions")
            else inline_refs(value, root, depth) for key, value in schema.items()
            if key not in ("$defs", "definitions") or schema is root}


def _resolve(reference: str, root: Mapping[str, Any]) -> Mapping[str, Any]:
    parts = reference.split("/")
    if len(parts) != 3 or parts[0] != "#" or parts[1] not in ("$defs", "definitions"):
        raise ValueError(f"the reference {reference} is not one to #/$defs/NAME or #/definitions/NAME")
    found = (root.get(parts[1]) or {}).get(parts[2]) if isinstance(root.get(parts[1]), dict) else None
    if not isinstance(found, dict):
        raise ValueError(f"the reference {reference} names nothing")
    return found


def value_types(schema: Any) -> set[str]:
    """The JSON types a value of ``schema`` may have (empty: it does not say)."""
    if not isinstance(schema, Mapping):
        return set()
    found: set[str] = set()
    kind = schema.get("type")
    found |= {kind} if isinstance(kind, str) else {k for k in kind if isinstance(k, str)} \
        if isinstance(kind, list) else set()
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key) or ():
            found |= value_types(branch)
    values = list(schema.get("enum") or ()) + ([schema["const"]] if "const" in schema else [])
    found |= {next(name for kind_, name in _JSON_TYPES if isinstance(value, kind_)) for value in values}
    return found


def written_raw(schema: Any) -> bool:
    """Whether the XML format writes a value of ``schema`` as its text (else as JSON)."""
    types = value_types(schema)
    return "string" in types or not types


NOT_JSON = object()
# Deeper JSON is text: json's recursion limit would make the outcome depend on the caller's stack depth.
_DEEPEST = 100
_STRING_OR_BRACKET = re.compile(r'"(?:[^"\\]|\\.)*"|[][{}]', re.DOTALL)
_BRACKET_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):  # json.dumps would write it back as NaN or Infinity, which are not JSON
        raise ValueError(f"{text} is not a finite number")
    return number


def strict_json(text: str) -> Any:
    """``text`` as strict JSON (no NaN or infinities, at most ``_DEEPEST`` deep), or ``NOT_JSON``."""
    steps = (_BRACKET_STEP.get(token, 0) for token in _STRING_OR_BRACKET.findall(text))
    if max(itertools.accumulate(steps), default=0) > _DEEPEST:
        return NOT_JSON
    try:
        return json.loads(text, parse_float=_finite, parse_constant=_finite)
    except (ValueError, RecursionError):
        return NOT_JSON


_IS_TYPE: dict[str, Callable[[object], bool]] = {
    "integer": lambda value: isinstance(value, int) and not isinstance(value, bool),
    "number": lambda value: isinstance(value, int | float) and not isinstance(value, bool),
    "boolean": lambda value: isinstance(value, bool),
    "null": lambda value: value is None,
    "object": lambda value: isinstance(value, dict),
    "array": lambda value: isinstance(value, list),
}
# The Qwen3.5 template writes scalars with Jinja's `string` filter: Python's spellings of these three.
_PYTHON_WORDS: dict[str, object] = {"True": True, "False": False, "None": None}


def parameter_value(raw: str, schema: Mapping[str, Any], key: str) -> object:
    """An XML parameter's text as the value its schema types: JSON when it parses as that type, else
    the text itself (a string, an unknown parameter or type, or a value the model wrote wrong)."""
    properties = schema.get("properties")
    declared = properties.get(key) if isinstance(properties, Mapping) else None
    checks = [_IS_TYPE[name] for name in value_types(declared) if name in _IS_TYPE]
    if written_raw(declared) or not checks:
        return raw
    value = strict_json(raw)
    if value is NOT_JSON:
        value = _PYTHON_WORDS.get(raw.strip(), NOT_JSON)
    return value if any(check(value) for check in checks) else raw

"""Hypothesis strategies for JSON: values a JSON Schema accepts, and any JSON at all.

``from_schema`` covers the keywords tfd's OpenAPI description uses (type, const, enum, anyOf, not
required, properties, required, additionalProperties, propertyNames, maxProperties, pattern,
minimum, maximum, exclusiveMinimum, minLength, minItems, maxItems, items) and raises on any other, so the
description cannot grow a rule the generator would silently ignore. An ``anyOf`` beside other
keywords is taken a branch at a time, the branch's properties narrowing the rest's; every value is
then checked against the whole schema with ``jsonschema`` (the reference validator), so what it
yields is valid whatever the merge missed.
"""

from __future__ import annotations

from typing import Any

import jsonschema
from hypothesis import strategies as st

KNOWN = frozenset({"type", "const", "enum", "anyOf", "not", "properties", "required", "propertyNames",
                   "minimum", "maximum", "exclusiveMinimum", "minLength", "minItems", "maxItems", "items",
                   "description", "additionalProperties", "maxProperties", "pattern"})
MOST_ITEMS = 4  # arrays without maxItems: short, requests stay quick
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=24)

scalars = st.none() | st.booleans() | st.integers(-(1 << 64), 1 << 64) | \
    st.floats(allow_nan=False, allow_infinity=False) | TEXT
any_json = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) |
                        st.dictionaries(TEXT, inner, max_size=4), max_leaves=12)


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values valid under ``schema`` (JSON Schema 2020-12, the subset in ``KNOWN``)."""
    valid = jsonschema.Draft202012Validator(schema).is_valid
    return _values(schema).filter(valid)


def _values(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    unknown = schema.keys() - KNOWN
    if unknown:
        raise ValueError(f"the generator does not know {sorted(unknown)}")
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        rest = {key: value for key, value in schema.items() if key != "anyOf"}
        return st.one_of([_values(_narrowed(rest, branch)) for branch in schema["anyOf"]])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([_values({**schema, "type": one}) for one in kind])
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "number":
        low = schema.get("exclusiveMinimum", schema.get("minimum"))
        return st.floats(low, schema.get("maximum"), exclude_min="exclusiveMinimum" in schema,
                         allow_nan=False, allow_infinity=False)
    if kind == "string" and "pattern" in schema:
        return st.from_regex(schema["pattern"], fullmatch=True)
    if kind == "string":
        return st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)),
                       min_size=schema.get("minLength", 0), max_size=40)
    if kind == "array":
        items = _values(schema.get("items", {"type": "string"}))
        return st.lists(items, min_size=schema.get("minItems", 0),
                        max_size=schema.get("maxItems", max(MOST_ITEMS, schema.get("minItems", 0))))
    if kind == "object" or "properties" in schema or "required" in schema:
        return _object(schema)
    if kind is None and schema.keys() <= {"description"}:
        return any_json
    raise ValueError(f"the generator cannot make values of {schema}")


def _narrowed(rest: dict[str, Any], branch: dict[str, Any]) -> dict[str, Any]:
    """``rest`` with ``branch`` laid over it: its properties replace rest's, its required add."""
    if "properties" not in rest and "required" not in rest and rest.get("type") != "object":
        return {**rest, **branch}
    merged = {**rest, **{key: value for key, value in branch.items()
                         if key not in ("properties", "required")}}
    merged["properties"] = {**rest.get("properties", {}), **branch.get("properties", {})}
    merged["required"] = sorted({*rest.get("required", ()), *branch.get("required", ())})
    return merged


def _object(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    properties = dict(schema.get("properties", {}))
    forbidden = set(schema.get("not", {}).get("required", ()))
    if schema.get("not", {}).keys() - {"required"}:
        raise ValueError(f"the generator knows only not: required, got {schema['not']}")
    required = {name: _values(properties.get(name, {})) for name in schema.get("required", ())}
    optional = {name: _values(sub) for name, sub in properties.items()
                if name not in required and name not in forbidden}
    extra = schema.get("additionalProperties", True)
    if properties or required:  # only the properties named (what additionalProperties: false asks)
        if extra not in (False, True):
            raise ValueError(f"the generator knows a schema of additionalProperties only alone, got {schema}")
        return st.fixed_dictionaries(required, optional=optional)
    names = TEXT
    if "propertyNames" in schema:
        names = _values(schema["propertyNames"]) if "pattern" in schema["propertyNames"] else \
            TEXT.filter(jsonschema.Draft202012Validator(schema["propertyNames"]).is_valid)
    values = _values(extra) if isinstance(extra, dict) else any_json
    return st.dictionaries(names, values, max_size=min(3, schema.get("maxProperties", 3)))

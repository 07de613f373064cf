"""A chat request's tools, read strictly: ``tools``, ``tool_choice`` and ``parallel_tool_calls``.

Function tools only (OpenAI's ``custom`` tools and the ``allowed_tools`` choice are refused by name).
A function's name is what OpenAI allows (letters, digits, ``_`` and ``-``, at most 64); its
``parameters`` a JSON Schema object (none: no parameters; its local references inlined, one that
loops or names nothing refused); two tools may not share a name; ``strict`` functions' calls must
match their schema exactly (a grammar, ``tfd.server.tool_grammar``).
``tool_choice``: ``auto`` (the default with tools), ``none`` (the default without), ``required``, or
a named function, which must be one of ``tools``; ``required`` and a named function need tools.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from tfd.server.bad_request import BadRequest
from tfd.server.tool_schema import inline_refs

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
Choice = Literal["auto", "none", "required", "named"]


@attrs.frozen
class Tools:
    """``declared``: the tools as the template receives them; ``functions``: each function's name to
    its parameters' schema; ``choice`` and, when ``named``, the function it names; ``parallel``: more
    than one call a reply may be made."""

    declared: tuple[dict[str, Any], ...]
    functions: Mapping[str, Mapping[str, Any]]  # their references inlined (``tool_schema``)
    choice: Choice
    named: str | None = None
    parallel: bool = True
    strict: frozenset[str] = frozenset()  # the functions whose calls must match their schema exactly

    @property
    def offered(self) -> bool:
        """Whether the model is told of the tools and its calls read (``tool_choice`` other than none)."""
        return bool(self.declared) and self.choice != "none"

    @property
    def forced(self) -> bool:
        """Whether the reply must be a call (``required``, or a named function)."""
        return self.choice in ("required", "named")


def read_tools(fields: Mapping[str, Any]) -> Tools | None:
    """The request's tools; None when it has none and chooses none (or nothing)."""
    declared = _tools(fields.get("tools"))
    functions = {}
    for i, tool in enumerate(declared):
        try:
            functions[tool["function"]["name"]] = inline_refs(tool["function"].get("parameters") or {})
        except ValueError as error:
            raise BadRequest(f"tools[{i}].function.parameters: {error}", f"tools[{i}].function.parameters") \
                from None
    strict = frozenset(tool["function"]["name"] for tool in declared if tool["function"].get("strict"))
    parallel = fields.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise BadRequest("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    choice, named = _choice(fields.get("tool_choice"), functions)
    if not declared and choice in ("auto", "none"):
        return None
    return Tools(tuple(declared), functions, choice, named, parallel, strict)


def _tools(tools: object) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise BadRequest("tools must be an array of function tools", "tools")
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise BadRequest(f'{where}: only function tools ("type": "function") are supported',
                             f"{where}.type")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise BadRequest(f"{where}.function must be an object", f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise BadRequest(f"{where}.function.name must be 1 to 64 letters, digits, _ or -",
                             f"{where}.function.name")
        if name in seen:
            raise BadRequest(f"{where}.function.name: two tools are named {name}", f"{where}.function.name")
        seen.add(name)
        if not isinstance(function.get("description", ""), str):
            raise BadRequest(f"{where}.function.description must be a string",
                             f"{where}.function.description")
        parameters = function.get("parameters")
        if parameters is not None and not _object_schema(parameters):
            raise BadRequest(f"{where}.function.parameters must be a JSON Schema of an object (properties an "
                             f"object, required a list of names)", f"{where}.function.parameters")
        if not isinstance(function.get("strict", False), bool | None):
            raise BadRequest(f"{where}.function.strict must be a boolean", f"{where}.function.strict")
    return tools


def _object_schema(schema: object) -> bool:
    """Whether ``schema`` is a JSON Schema of an object whose properties and required names read."""
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        return False
    required = schema.get("required", [])
    return isinstance(schema.get("properties", {}), dict) and isinstance(required, list) and \
        all(isinstance(name, str) for name in required)


def _choice(choice: object, functions: Mapping[str, object]) -> tuple[Choice, str | None]:
    if choice is None:
        return ("auto" if functions else "none"), None
    if choice in ("auto", "none", "required"):
        if choice == "required" and not functions:
            raise BadRequest('tool_choice "required" needs tools', "tool_choice")
        return choice, None
    if isinstance(choice, dict) and choice.get("type") == "function":
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or name not in functions:
            raise BadRequest("tool_choice names a function that is not one of tools", "tool_choice")
        return "named", name
    raise BadRequest('tool_choice must be "none", "auto", "required" or {"type": "function", '
                     '"function": {"name": ...}}', "tool_choice")

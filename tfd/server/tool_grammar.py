"""The grammar of a reply that must be tool calls (``tool_choice`` ``required`` or a named function).

A call is written as the template teaches it (``tfd.server.tool_calls``'s formats), so the model
writes what it was trained to and the reply parses back into the same calls:

- XML (Qwen3.5): ``<tool_call>\\n<function=NAME>\\n`` then each parameter ``<parameter=P>\\nVALUE
  \\n</parameter>\\n`` (the required ones in the schema's order, each optional one in its place or
  left out), then ``</function>\\n</tool_call>``. A string value is text without ``<`` that does
  not end on a newline (so it cannot run into the closing tag; its ``enum``'s strings as literals,
  its ``pattern``, its lengths); any other value is JSON valid against the parameter's schema, as
  the template writes it back (``tool_schema.written_raw`` decides which, as the reader does).
- JSON (Qwen3, Qwen3-Next): ``<tool_call>\\n`` a JSON object ``{"name": ..., "arguments": ...}``
  valid against the named function's schema (one ``anyOf`` over the functions) ``\\n</tool_call>``.

Several calls, separated by a newline, unless ``parallel_tool_calls`` is false (then exactly one).
With ``tool_choice`` auto and a strict function or ``parallel_tool_calls`` false, the reply is free
text (without the call tag) and then valid calls or none (one at most when not parallel); with a
structured output beside the tools, the answer in form or calls. Tags that are special tokens of the
vocabulary are named as tokens (``structured.tag``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tfd.server.structured import Constraint, closed, json_rule, literal, tag
from tfd.server.tool_calls import ToolFormat
from tfd.server.tool_fields import Tools
from tfd.server.tool_schema import written_raw

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def tool_constraint(tools: Tools, fmt: ToolFormat, special: Callable[[str], int | None],
                    answer: Constraint | None = None) -> Constraint | None:
    """What ``tools``' choice asks of the reply: calls to its functions (the named one alone when
    ``tool_choice`` names one); under ``auto`` with a strict function or one call at most, free text
    then calls (valid ones) or none; ``answer`` (a structured output) or calls; None when the model
    is free."""
    calls = "call (\"\\n\" call)*" if tools.parallel else "call"
    rules = _call_rules(tools, fmt, special)
    if tools.forced:
        return Constraint(calls, "tool_choice", rules)
    if answer is not None:  # an answer in form, or calls in place of it
        return Constraint(f"({answer.body}) | {calls}", answer.field, rules + answer.rules)
    if tools.parallel and not tools.strict:
        return None
    field = "parallel_tool_calls" if not tools.parallel else "tools"
    never = f"~/(.|\\n)*{_regex_text(OPEN)}(.|\\n)*/"
    text = f"TEXT: /(.|\\n)*/ & {never}\n"
    if special(OPEN) is not None:  # the tag is a token the text cannot spell: the lexeme ends there
        return Constraint(f"TEXT? ({calls})?", field, rules + text)
    # text up to and with the first tag, one lexeme (a lexeme is greedy: text beside the tag would run
    # on past it), then the rest of the first call
    opened = f"OPENED: /(.|\\n)*{_regex_text(OPEN)}/ & ~/(.|\\n)*{_regex_text(OPEN)}(.|\\n)+/\n"
    more = " (\"\\n\" call)*" if tools.parallel else ""
    return Constraint(f"TEXT | OPENED call_rest{more}", field, rules + text + opened)


def _regex_text(text: str) -> str:
    """``text`` matched literally in a Lark regex (its metacharacters escaped; not ``<``, which the
    regex crate reads as a word boundary when escaped)."""
    return "".join(f"\\{char}" if char in "\\.+*?()|[]{}^$#&-~/" else char for char in text)


def _call_rules(tools: Tools, fmt: ToolFormat, special: Callable[[str], int | None]) -> str:
    """The rules ``call`` (a call, its tags too) and ``call_rest`` (after its opening tag) name."""
    names = [tools.named] if tools.named is not None else list(tools.functions)
    functions = {name: tools.functions[name] for name in names if name is not None}
    rules = [f"call: {tag(OPEN, special)} call_rest"]
    if fmt is ToolFormat.JSON:
        rules += [f"call_rest: \"\\n\" call_body \"\\n\" {tag(CLOSE, special)}",
                  f"call_body: {json_rule(_json_calls(functions, tools.strict))}"]
    else:
        rules.append(f"call_rest: \"\\n\" ({' | '.join(f'fn_{i}' for i in range(len(functions)))}) "
                     f"\"</function>\\n\" {tag(CLOSE, special)}")
        for i, (name, schema) in enumerate(functions.items()):
            rules += _xml_function(i, name, schema)
    return "\n".join(rules) + "\n"


def _json_calls(functions: Mapping[str, Mapping[str, Any]], strict: frozenset[str]) -> dict[str, Any]:
    """One call of any of ``functions`` (the ``strict`` ones' arguments closed: no properties past
    those named)."""
    calls = []
    for name, schema in functions.items():
        arguments = (closed(schema) if name in strict else schema) or {"type": "object"}
        calls.append({"type": "object", "properties": {"name": {"const": name}, "arguments": arguments},
                      "required": ["name", "arguments"], "additionalProperties": False})
    return {"anyOf": calls}


def _xml_function(index: int, name: str, schema: Mapping[str, Any]) -> list[str]:
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    parts, rules = [], []
    for j, (parameter, sub) in enumerate(properties.items()):
        rule = f"p_{index}_{j}"
        rules.append(f"{rule}: {literal(f'<parameter={parameter}>' + chr(10))} {_value(sub)}")
        parts.append(rule if parameter in required else f"{rule}?")
    header = literal(f"<function={name}>\n")
    return [f"fn_{index}: {header} {' '.join(parts)}".rstrip(), *rules]


def _value(schema: Any) -> str:
    """A parameter's value and its closing tag, the value as the template writes it (``written_raw``):
    text (one lexeme with the tag: a lexeme is greedy, so text beside the tag would run on past where
    it could end; its enum's strings, its pattern or its lengths when it has them), else JSON."""
    end = literal("\n</parameter>\n")
    if not isinstance(schema, dict):
        return f"{json_rule({})} {end}"
    if not written_raw(schema):
        return f"{json_rule(schema)} {end}"
    words = [value for value in schema.get("enum") or () if isinstance(value, str)]
    if words:
        return "(" + " | ".join(literal(value) for value in words) + f") {end}"
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and pattern:  # its whole text matches it, anchors or not
        body = pattern.removeprefix("^").removesuffix("$").replace("/", "\\/")
        return f"/({body})\\n<\\/parameter>\\n/"
    low = schema.get("minLength") if isinstance(schema.get("minLength"), int) else 0
    most = schema.get("maxLength")
    text = f"[^<]{{{low},{most}}}" if isinstance(most, int) else f"[^<]{{{low},}}"
    return f"/{text}\\n<\\/parameter>\\n/"

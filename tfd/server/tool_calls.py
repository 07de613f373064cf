"""Tool calls in a Qwen model's reply: found in its text, parsed, and streamed as OpenAI ``tool_calls``.

The chat template (``tool_format``) has the model write each call in ``<tool_call>``...``</tool_call>``
as XML (Qwen3.5, Qwen3-Coder: ``<function=NAME>``, per argument ``<parameter=KEY>``, its value between
newlines, ``</parameter>``; then ``</function>``; strings raw, other values as JSON, so the tool's
schema reads them back) or as JSON (Qwen2.5, Qwen3, Qwen3-Next: ``{"name": NAME, "arguments": {...}}``).
``parse_tool_calls`` reads a whole reply, ``ToolCallStream`` one piece at a time. A block that is no
valid call of a known tool stays in the content as written: malformed model output is text, never an
error. Whitespace next to a valid call is no content: the text before a call loses its trailing
whitespace, and the text after the last call is dropped when it is only whitespace.
"""

from __future__ import annotations

import enum
import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from tfd.server.tool_schema import parameter_value, strict_json

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"

Tools = Mapping[str, Mapping[str, Any]]  # a tool's name -> its parameters' JSON schema


class ToolFormat(enum.Enum):
    """How a checkpoint's chat template asks the model to write a call."""

    XML = "xml"
    JSON = "json"


def tool_format(template_source: str) -> ToolFormat | None:
    """The call format ``template_source`` teaches the model; None when it teaches none."""
    if FUNCTION in template_source:
        return ToolFormat.XML
    if OPEN in template_source:
        return ToolFormat.JSON
    return None


@attrs.frozen
class ToolCall:
    """One call the model made: ``arguments`` is a JSON object as text."""

    id: str
    name: str
    arguments: str

    def openai(self, index: int | None = None) -> dict[str, Any]:
        """The call as a message's ``tool_calls`` item, or with ``index`` as a stream delta's."""
        item: dict[str, Any] = {} if index is None else {"index": index}
        item.update(id=self.id, type="function", function={"name": self.name, "arguments": self.arguments})
        return item


@attrs.frozen
class Delta:
    """One step of a streamed reply: content text, or a ``delta.tool_calls[]`` item."""

    content: str | None = None
    tool_call: dict[str, Any] | None = None


_dumps = functools.partial(json.dumps, ensure_ascii=False)


def _function_header(region: str) -> tuple[str, int] | None:
    """From the text after ``<tool_call>``: the name in its ``<function=NAME>`` and where that header
    ends; None when the text does not start (after whitespace) with a whole header."""
    start = len(region) - len(region.lstrip())
    end = region.find(">", start + len(FUNCTION)) if region.startswith(FUNCTION, start) else -1
    if end < 0:
        return None
    return region[start + len(FUNCTION):end].strip(), end + 1


def _parameter_at(region: str, pos: int) -> tuple[str, str, int] | None:
    """The first whole ``<parameter=KEY>VALUE</parameter>`` after ``pos`` and before ``</function>``:
    KEY, VALUE less the newline the template puts at each end, and where it ends; None when none.
    What a prefix of the text gives, the whole text gives too: the stream may act on it."""
    opening = region.find(PARAMETER, pos)
    function_end = region.find(FUNCTION_END, pos)
    if opening < 0 or 0 <= function_end < opening:
        return None
    key_end = region.find(">", opening + len(PARAMETER))
    if key_end < 0:
        return None
    value_end = region.find(PARAMETER_END, key_end + 1)
    if value_end < 0:
        return None
    value = region[key_end + 1:value_end].removeprefix("\n").removesuffix("\n")
    return region[opening + len(PARAMETER):key_end].strip(), value, value_end + len(PARAMETER_END)


def _xml_call(body: str, tools: Tools) -> tuple[str, str] | None:
    """The name and arguments of the XML call in ``body`` (a whole block's inside), or None.

    Once its header names a known tool the block is a call (the stream has announced it by then): a
    parameter never closed is left out, and text between parameters or after ``</function>`` ignored.
    """
    header = _function_header(body)
    if header is None or header[0] not in tools:
        return None
    name, pos = header
    arguments: dict[str, object] = {}
    while (parameter := _parameter_at(body, pos)) is not None:
        key, raw, pos = parameter
        # The first value is kept: the stream has already sent it.
        if key not in arguments:
            arguments[key] = parameter_value(raw, tools[name], key)
    return name, _dumps(arguments)


def _json_call(body: str, tools: Tools) -> tuple[str, str] | None:
    """The name and arguments of the JSON call in ``body`` (a whole block's inside), or None."""
    call = strict_json(body)
    if not isinstance(call, dict):
        return None
    name, arguments = call.get("name"), call.get("arguments")
    if not isinstance(name, str) or name not in tools:
        return None
    if isinstance(arguments, str):
        arguments = strict_json(arguments)
    if not isinstance(arguments, dict):
        return None
    return name, _dumps(arguments)


def parse_tool_calls(text: str, fmt: ToolFormat, tools: Tools,
                     call_id: Callable[[int], str]) -> tuple[str, tuple[ToolCall, ...]]:
    """The content and the valid calls of a whole reply.

    ``tools`` maps each known tool's name to its parameters' schema; ``call_id(i)`` names the i-th
    valid call. Each valid block leaves the content, with the whitespace next to it (see the module's
    docstring); any other block, or a ``<tool_call>`` never closed, stays as written. Without a valid
    call the content is ``text`` unchanged.
    """
    read = _xml_call if fmt is ToolFormat.XML else _json_call
    pieces: list[str] = []
    calls: list[ToolCall] = []
    start = scan = 0  # start: of the content after the last valid call; scan: of the next search
    while (opening := text.find(OPEN, scan)) >= 0:
        closing = text.find(CLOSE, opening + len(OPEN))
        if closing < 0:
            break
        call = read(text[opening + len(OPEN):closing], tools)
        scan = closing + len(CLOSE)
        if call is not None:
            pieces.append(text[start:opening].rstrip())
            calls.append(ToolCall(call_id(len(calls)), *call))
            start = scan
    if not calls:
        return text, ()
    tail = text[start:]
    pieces.append(tail if tail.strip() else "")
    return "".join(pieces), tuple(calls)


class _State(enum.Enum):
    TEXT = enum.auto()  # content, watching for <tool_call>
    HEADER = enum.auto()  # after <tool_call> (XML): waiting for <function=NAME>
    ARGUMENTS = enum.auto()  # an announced XML call: reading its parameters
    AFTER = enum.auto()  # an XML call ended by </function>: skipping to </tool_call>
    BLOCK = enum.auto()  # a JSON block, held whole until </tool_call>
    INVALID = enum.auto()  # a block that is no call: content up to its </tool_call>


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``tag``."""
    return next((size for size in range(min(len(tag) - 1, len(text)), 0, -1) if text.endswith(tag[:size])), 0)


class ToolCallStream:
    """Reads a reply piece by piece (a tag may be cut anywhere) and gives its deltas as they are known.

    Content is released once it cannot start a call: only an end that could begin ``<tool_call>`` is
    held, with the whitespace before it (dropped if a call follows). An XML call is announced once its
    ``<function=NAME>`` names a known tool, then its arguments follow a parameter at a time; a JSON block
    is held until ``</tool_call>``. Joined, the content and each call's arguments are what
    ``parse_tool_calls`` gives for the whole text, but for an XML call cut off after its announcement:
    ``finish`` closes it with the parameters it completed, where ``parse_tool_calls`` keeps it as text.
    """

    def __init__(self, fmt: ToolFormat, tools: Tools, call_id: Callable[[int], str]) -> None:
        self._fmt, self._tools, self._call_id = fmt, tools, call_id
        self._state = _State.TEXT
        self._buffer = ""  # the text the state has read but not yet released or used
        self._spaces = ""  # whitespace before the open block: content only if the block is no call
        self._wrote_since_call = False  # content released since the last call
        self._calls: list[ToolCall] = []
        self._out: list[Delta] = []
        # The XML call being read.
        self._name = self._id = ""
        self._fragments: list[str] = []
        self._keys: set[str] = set()

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        """The valid calls completed so far."""
        return tuple(self._calls)

    def feed(self, text: str) -> list[Delta]:
        """The deltas that the next piece of the reply makes known."""
        self._buffer += text
        # These states wait for a tag's '>': skipping them until one comes keeps long arguments cheap.
        if self._state not in (_State.ARGUMENTS, _State.AFTER, _State.BLOCK) or ">" in text:
            while self._step():
                pass
        out, self._out = self._out, []
        return out

    def finish(self) -> list[Delta]:
        """The deltas at the end of the reply: what was held, and the close of a cut-off XML call."""
        state, held = self._state, self._buffer
        # Whitespace after the last call is no content; any other held text is.
        if state is _State.INVALID or (state is _State.TEXT and (
                held.strip() or self._wrote_since_call or not self._calls)):
            self._release(held)
        elif state in (_State.HEADER, _State.BLOCK):
            self._release(self._spaces + OPEN + held)
        elif state is _State.ARGUMENTS:
            self._close_call()
        self._state, self._buffer, self._spaces = _State.TEXT, "", ""
        out, self._out = self._out, []
        return out

    def _release(self, text: str) -> None:
        """Sends ``text`` as content, in one delta with any content just before it."""
        if not text:
            return
        last = self._out[-1].content if self._out else None
        if last is None:
            self._out.append(Delta(content=text))
        else:
            self._out[-1] = Delta(content=last + text)
        self._wrote_since_call = True

    def _step(self) -> bool:
        """Reads what the buffer allows in the current state; True when the state changed."""
        read = {_State.TEXT: self._read_text, _State.HEADER: self._read_header,
                _State.ARGUMENTS: self._read_arguments, _State.BLOCK: self._read_block}
        return read.get(self._state, self._skip_to_close)()

    def _read_text(self) -> bool:
        buffer = self._buffer
        opening = buffer.find(OPEN)
        if opening < 0:
            # Held: an end that may begin <tool_call>, and the whitespace before it.
            released = buffer[:len(buffer) - _partial_suffix(buffer, OPEN)].rstrip()
            self._release(released)
            self._buffer = buffer[len(released):]
            return False
        before = buffer[:opening].rstrip()
        self._release(before)
        self._spaces = buffer[len(before):opening]
        self._buffer = buffer[opening + len(OPEN):]
        self._state = _State.HEADER if self._fmt is ToolFormat.XML else _State.BLOCK
        return True

    def _read_header(self) -> bool:
        closing = self._buffer.find(CLOSE)
        region = self._buffer if closing < 0 else self._buffer[:closing]
        header, head = _function_header(region), region.lstrip()
        if header is not None and header[0] in self._tools:
            self._announce(header[0])
            self._buffer = self._buffer[header[1]:]
            self._state = _State.ARGUMENTS
            return True
        if header is not None or closing >= 0 or not (head.startswith(FUNCTION) or FUNCTION.startswith(head)):
            # No call: the block so far is content, and so is the rest of it up to </tool_call>.
            self._release(self._spaces + OPEN)
            self._spaces = ""
            self._state = _State.INVALID
            return True
        return False

    def _read_arguments(self) -> bool:
        closing = self._buffer.find(CLOSE)
        region = self._buffer if closing < 0 else self._buffer[:closing]
        pos = 0
        while (parameter := _parameter_at(region, pos)) is not None:
            key, raw, pos = parameter
            self._add_argument(key, raw)
        if closing >= 0:
            self._close_call()
            self._buffer = self._buffer[closing + len(CLOSE):]
            self._state = _State.TEXT
            return True
        self._buffer = region[pos:]
        function_end = self._buffer.find(FUNCTION_END)
        if function_end >= 0 and not 0 <= self._buffer.find(PARAMETER) < function_end:
            self._close_call()
            self._state = _State.AFTER
            return True
        return False

    def _add_argument(self, key: str, raw: str) -> None:
        # The first value is kept, as parse_tool_calls keeps it.
        if key in self._keys:
            return
        value = parameter_value(raw, self._tools[self._name], key)
        fragment = ("{" if not self._keys else ", ") + f"{_dumps(key)}: {_dumps(value)}"
        self._keys.add(key)
        self._send_arguments(fragment)

    def _announce(self, name: str) -> None:
        self._name, self._id = name, self._call_id(len(self._calls))
        self._out.append(Delta(tool_call=ToolCall(self._id, name, "").openai(len(self._calls))))
        self._fragments, self._keys, self._spaces = [], set(), ""

    def _close_call(self) -> None:
        self._send_arguments("}" if self._keys else "{}")
        self._end_call()

    def _end_call(self) -> None:
        self._calls.append(ToolCall(self._id, self._name, "".join(self._fragments)))
        self._wrote_since_call = False

    def _send_arguments(self, fragment: str) -> None:
        self._fragments.append(fragment)
        self._out.append(Delta(tool_call={"index": len(self._calls), "function": {"arguments": fragment}}))

    def _read_block(self) -> bool:
        closing = self._buffer.find(CLOSE)
        if closing < 0:
            return False
        body, self._buffer = self._buffer[:closing], self._buffer[closing + len(CLOSE):]
        self._state = _State.TEXT
        call = _json_call(body, self._tools)
        if call is None:
            self._release(self._spaces + OPEN + body + CLOSE)
            self._spaces = ""
        else:
            self._announce(call[0])
            self._send_arguments(call[1])
            self._end_call()
        return True

    def _skip_to_close(self) -> bool:
        """Up to ``</tool_call>``: content in an invalid block, nothing after an XML call's end."""
        buffer = self._buffer
        closing = buffer.find(CLOSE)
        end = closing + len(CLOSE) if closing >= 0 else len(buffer) - _partial_suffix(buffer, CLOSE)
        if self._state is _State.INVALID:
            self._release(buffer[:end])
        self._buffer = buffer[end:]
        if closing < 0:
            return False
        self._state = _State.TEXT
        return True

"""A chat reply's text as the message OpenAI's clients read: its thought, its content, its tool calls.

The thought is split off first (``tfd.server.reasoning``); tool calls are read from what remains
(``tfd.server.tool_calls``), in the format the template writes them. ``message`` reads a whole
reply; ``MessageStream`` the same as the text comes, as stream deltas (``reasoning_content``,
``content``, ``tool_calls``), whose pieces add up to the whole reply's message. A call's id is the
request's id and the call's number, so a repeated request gives the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tfd.server.chat_prompt import Reading
from tfd.server.reasoning import ReasoningStream, split_reasoning
from tfd.server.tool_calls import ToolCall, ToolCallStream, parse_tool_calls


def call_ids(request_id: str, choice: int = 0) -> Callable[[int], str]:
    """The ids of a reply's calls: ``call_<request id>_<choice>_<number>``."""
    return lambda number: f"call_{request_id}_{choice}_{number}"


def message(text: str, reading: Reading, call_id: Callable[[int], str]) -> tuple[dict[str, Any], bool]:
    """The assistant message of a whole reply, and whether it made calls."""
    found: dict[str, Any] = {"role": "assistant"}
    content = text
    if reading.inside is not None:
        split = split_reasoning(text, reading.inside)
        found["reasoning_content"], content = split.reasoning, split.content
    calls: tuple[ToolCall, ...] = ()
    if reading.tools is not None and reading.tool_format is not None:
        content, calls = parse_tool_calls(content, reading.tool_format, reading.tools.functions, call_id)
    found["content"] = content if content or not calls else None
    if calls:
        found["tool_calls"] = [call.openai() for call in calls]
    return found, bool(calls)


class MessageStream:
    """A reply's stream deltas as its text comes (``feed``) and when it ends (``finish``)."""

    def __init__(self, reading: Reading, call_id: Callable[[int], str]) -> None:
        self._thought = None if reading.inside is None else ReasoningStream(reading.inside)
        self._calls = None
        if reading.tools is not None and reading.tool_format is not None:
            self._calls = ToolCallStream(reading.tool_format, reading.tools.functions, call_id)

    @property
    def called(self) -> bool:
        """Whether the reply made calls so far."""
        return self._calls is not None and bool(self._calls.calls)

    def feed(self, text: str) -> list[dict[str, Any]]:
        """The deltas ``text`` settles (none while all of it is held back)."""
        if self._thought is None:
            return self._content(text, False)
        pieces = self._thought.feed(text)
        return self._deltas(pieces.reasoning, pieces.content, False)

    def finish(self) -> list[dict[str, Any]]:
        """The deltas of what was held back when the reply ended."""
        if self._thought is None:
            return self._content("", True)
        pieces = self._thought.finish()
        return self._deltas(pieces.reasoning, pieces.content, True)

    def _deltas(self, reasoning: str, content: str, last: bool) -> list[dict[str, Any]]:
        found = [{"reasoning_content": reasoning}] if reasoning else []
        return found + self._content(content, last)

    def _content(self, text: str, last: bool) -> list[dict[str, Any]]:
        if self._calls is None:
            return [{"content": text}] if text else []
        deltas = self._calls.feed(text) if text else []
        if last:
            deltas += self._calls.finish()
        found: list[dict[str, Any]] = []
        for delta in deltas:
            if delta.content:
                found.append({"content": delta.content})
            if delta.tool_call is not None:
                found.append({"tool_calls": [delta.tool_call]})
        return found

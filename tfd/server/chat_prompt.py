"""A chat request rendered into its prompt, with what reading its reply needs.

The checkpoint's template receives the messages (tool calls' arguments as objects), the request's
``chat_template_kwargs``, its tools (unless ``tool_choice`` is ``none``) and, from
``reasoning_effort``, its thinking switch (``enable_thinking``: off for ``none``, on for every other
effort). A request the template cannot serve is refused by name: tools for a template that takes
none, ``reasoning_effort`` for one without the switch, or with a switch the request also sets the
other way.

Keep marks (where the prompt cache keeps states, besides the prompt's end): where the latest user
message starts, and where the generation prompt starts, since a next turn renders this turn's
reply without the thought its generation prompt opened: the state before the generation prompt is
the longest that next turn shares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import tokenizers

from tfd.chat import ChatTemplate, ChatTemplateError
from tfd.server.bad_request import BadRequest
from tfd.server.reasoning import opens_thought, thinks
from tfd.server.schema import ChatBody
from tfd.server.tool_calls import ToolFormat, tool_format
from tfd.server.tool_fields import Tools

SWITCH = "enable_thinking"


@attrs.frozen
class Reading:
    """How a reply's text becomes a message: ``inside`` whether it starts inside a thought (None: the
    template writes none); the tools it may call and the format it writes calls in."""

    inside: bool | None = None
    tools: Tools | None = None
    tool_format: ToolFormat | None = None


@attrs.frozen
class ChatPrompt:
    ids: tuple[int, ...]
    marks: tuple[int, ...]
    reading: Reading


def chat_prompt(body: ChatBody, template: ChatTemplate, tokenizer: tokenizers.Tokenizer,
                marks: bool) -> ChatPrompt:
    """``body``'s prompt as ``template`` renders it, tokenized; ``marks``: find its keep marks (a
    server with a prompt cache). Raises ``BadRequest`` for what the template refuses or cannot take."""
    kwargs = dict(body.template_kwargs)
    _thinking_switch(body.reasoning_effort, template, kwargs)
    tools, fmt = body.tools, None
    if tools is not None and tools.offered:
        fmt = tool_format(template.source)
        if fmt is None:
            raise BadRequest("tools: this model's chat template takes no tools", "tools")
        if "tools" in kwargs:
            raise BadRequest("chat_template_kwargs may not set tools: the request gives them",
                             "chat_template_kwargs.tools")
        kwargs["tools"] = list(tools.declared)
    messages = list(body.messages)
    text = render(template, messages, True, kwargs)
    ids = _encode(tokenizer, text)
    conversation = render(template, messages, False, kwargs)
    generation = text[len(conversation):] if text.startswith(conversation) else text
    inside = opens_thought(generation) if thinks(template.source) else None
    found: tuple[int, ...] = ()
    if marks:
        found = tuple(sorted({*_latest_user_mark(template, tokenizer, messages, kwargs, ids),
                              *_prefix_mark(tokenizer, conversation, ids)}))
    return ChatPrompt(ids, found, Reading(inside, tools if fmt is not None else None, fmt))


def _thinking_switch(effort: str | None, template: ChatTemplate, kwargs: dict[str, Any]) -> None:
    """``reasoning_effort`` as the template's switch, set in ``kwargs``."""
    if effort is None:
        return
    if SWITCH not in template.source:
        raise BadRequest("reasoning_effort: this model's chat template has no thinking switch",
                         "reasoning_effort")
    wanted = effort != "none"
    if SWITCH in kwargs and kwargs[SWITCH] != wanted:
        raise BadRequest(f"reasoning_effort {effort!r} contradicts chat_template_kwargs.{SWITCH}",
                         "reasoning_effort")
    kwargs[SWITCH] = wanted


def render(template: ChatTemplate, messages: Sequence[Mapping[str, object]], generation: bool,
           kwargs: Mapping[str, Any]) -> str:
    """``template``'s text for ``messages``; ``BadRequest`` naming them when it refuses or fails."""
    try:
        return template.render(messages, add_generation_prompt=generation, **kwargs)
    except ChatTemplateError as error:
        raise BadRequest(f"the chat template refused the messages: {error.message}", "messages") from None


def _encode(tokenizer: tokenizers.Tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=False).ids)


def _prefix_mark(tokenizer: tokenizers.Tokenizer, text: str, ids: tuple[int, ...]) -> tuple[int, ...]:
    """Where ``text`` ends in ``ids``, when it tokenizes to a proper prefix of them; else nothing."""
    head = _encode(tokenizer, text)
    return (len(head),) if 0 < len(head) < len(ids) and ids[:len(head)] == head else ()


def _latest_user_mark(template: ChatTemplate, tokenizer: tokenizers.Tokenizer,
                      messages: Sequence[Mapping[str, object]], kwargs: Mapping[str, Any],
                      ids: tuple[int, ...]) -> tuple[int, ...]:
    """Where the chat's latest user message starts in ``ids``: the conversation before it, rendered
    and tokenized, when that is a prefix of ``ids`` (a template may render earlier turns differently
    once a later one follows; then no mark)."""
    latest = max((i for i, message in enumerate(messages) if message.get("role") == "user"), default=0)
    if latest == 0:
        return ()
    try:
        before = template.render(list(messages[:latest]), add_generation_prompt=False, **kwargs)
    except ChatTemplateError:
        return ()
    return _prefix_mark(tokenizer, before, ids)

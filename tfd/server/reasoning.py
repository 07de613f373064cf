"""A reply's thought, told apart from what it says: ``<think>...</think>`` as Qwen's templates write it.

A template that thinks (its source names both tags) opens the thought in its generation prompt
(Qwen3.5: ``<|im_start|>assistant\\n<think>\\n``), or leaves it to the model, which then starts its
reply with ``<think>``; with thinking switched off it writes an empty thought itself
(``<think>\\n\\n</think>\\n\\n``) and the reply is all content. ``opens_thought`` reads which case a
rendered generation prompt is. The thought is the text up to ``</think>`` without the newlines that
edge it; the content is what follows, without the newlines that lead it (as the template strips both
when it renders the turn back). A reply cut off inside its thought is all thought.

``split_reasoning`` splits a whole reply; ``ReasoningStream`` splits one as its text comes, holding
back only what may yet be a tag or an edge newline, so the pieces it gives add up to the split.
"""

from __future__ import annotations

import attrs

OPEN, CLOSE = "<think>", "</think>"


def thinks(template_source: str) -> bool:
    """Whether a chat template writes thoughts (its replies may hold one to split)."""
    return OPEN in template_source and CLOSE in template_source


def opens_thought(generation_prompt: str) -> bool:
    """Whether ``generation_prompt`` (what the template adds to ask for a reply) leaves a thought open:
    the reply starts inside it."""
    return generation_prompt.rfind(OPEN) > generation_prompt.rfind(CLOSE)


@attrs.frozen
class Split:
    """``reasoning``: the thought (None: the reply had none); ``content``: the rest."""

    reasoning: str | None
    content: str


def split_reasoning(text: str, inside: bool) -> Split:
    """``text``, a whole reply that starts inside a thought when ``inside``, split."""
    if not inside:
        opened = text.lstrip()
        if not opened.startswith(OPEN):
            return Split(None, text)
        text = opened[len(OPEN):]
    thought, closed, rest = text.partition(CLOSE)
    return Split(thought.strip("\n"), rest.lstrip("\n") if closed else "")


@attrs.frozen
class Pieces:
    """What one piece of reply text adds to the thought and to the content."""

    reasoning: str = ""
    content: str = ""


class ReasoningStream:
    """Splits a reply given piece by piece; ``inside``: it starts inside a thought. The pieces it
    returns, joined, are ``split_reasoning``'s of the whole text (a reasoning of None: none given)."""

    def __init__(self, inside: bool) -> None:
        self._state = "thought-edge" if inside else "start"
        self._held = ""

    def feed(self, text: str) -> Pieces:
        """The next piece of reply text; what it settles of thought and content."""
        self._held += text
        reasoning, content = [], []
        while self._held:
            state, held = self._state, self._held
            if state == "start":  # is the reply a thought? only whitespace and part of the tag so far: wait
                opened = held.lstrip()
                if opened.startswith(OPEN):
                    self._state, self._held = "thought-edge", opened[len(OPEN):]
                elif OPEN.startswith(opened):
                    break
                else:
                    self._state = "content"
            elif state == "thought-edge":  # the newlines after the tag are not the thought's
                self._held = held.lstrip("\n")
                if self._held:
                    self._state = "thought"
            elif state == "thought":
                at = held.find(CLOSE)
                if at >= 0:
                    reasoning.append(held[:at].rstrip("\n"))
                    self._state, self._held = "content-edge", held[at + len(CLOSE):]
                    continue
                keep = _tail_to_hold(held)
                reasoning.append(held[:len(held) - keep])
                self._held = held[len(held) - keep:]
                break
            elif state == "content-edge":
                self._held = held.lstrip("\n")
                if self._held:
                    self._state = "content"
            else:
                content.append(held)
                self._held = ""
        return Pieces("".join(reasoning), "".join(content))

    def finish(self) -> Pieces:
        """The reply ended: what was held, settled (a tag never completed is text)."""
        held, self._held = self._held, ""
        if self._state == "start":
            return Pieces(content=held)
        if self._state == "thought":
            return Pieces(reasoning=held.rstrip("\n"))
        return Pieces()


def _tail_to_hold(text: str) -> int:
    """How many characters at the end of a thought's text may yet be its edge: trailing newlines, and
    before them or alone a start of ``</think>``."""
    for size in range(min(len(CLOSE) - 1, len(text)), 0, -1):
        if CLOSE.startswith(text[-size:]):
            return size + _newlines_before(text, len(text) - size)
    return _newlines_before(text, len(text))


def _newlines_before(text: str, end: int) -> int:
    count = 0
    while count < end and text[end - count - 1] == "\n":
        count += 1
    return count

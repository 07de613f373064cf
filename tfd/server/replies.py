"""OpenAI reply objects, built from the engine's events: whole replies and stream chunks.

One ``Reply`` follows one request and its ``n`` choices: it keeps each choice's text and tokens
so far and writes the JSON the chat or completions API gives under the request's id
(``tfd.server.access``: the engine's too), with ``usage`` (the prompt counted once, every choice's
tokens) and the ``tfd`` block (``token_sha`` of the reply's token ids, draft counts, time to first
token: choice 0's at the top, each choice's in it when there are several). A chat choice's text
is read into its message (``tfd.server.message_text``: thought, content, tool calls); its
``finish_reason`` is ``tool_calls`` when it ended by itself having made calls.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, Literal

import tokenizers

from tfd.engine.request import Emitted, Finished, TokenLogprob
from tfd.server.chat_prompt import Reading
from tfd.server.message_text import MessageStream, call_ids, message

Api = Literal["chat", "completion"]


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


class _Choice:
    """One choice's text and logprobs so far, and its message stream (chat)."""

    def __init__(self, index: int, stream: MessageStream | None) -> None:
        self.index = index
        self.text: list[str] = []
        self.logprobs: list[TokenLogprob] = []
        self.stream = stream


class Reply:
    def __init__(self, api: Api, request_id: str, model: str, prompt: tuple[int, ...],
                 tokenizer: tokenizers.Tokenizer, return_token_ids: bool, reading: Reading | None = None,
                 n: int = 1) -> None:
        self.api = api
        self.id = request_id
        self.model = model
        self.prompt = prompt
        self.tokenizer = tokenizer
        self.return_token_ids = return_token_ids
        self.reading = reading if reading is not None else Reading()
        self.created = int(time.time())
        self.choices = [_Choice(i, MessageStream(self.reading, call_ids(request_id, i)) if api == "chat"
                                else None) for i in range(n)]

    @property
    def object(self) -> str:
        if self.api == "chat":
            return "chat.completion"
        return "text_completion"

    def add(self, event: Emitted, index: int = 0) -> None:
        choice = self.choices[index]
        choice.text.append(event.text)
        choice.logprobs.extend(event.logprobs or ())

    def whole(self, finished: Sequence[Finished]) -> dict[str, Any]:
        """The non-streamed reply: ``finished`` each choice's last event, in order."""
        choices = []
        for choice, done in zip(self.choices, finished, strict=True):
            text = "".join(choice.text) + done.text
            entry: dict[str, Any] = {"index": choice.index, "finish_reason": finish_reason(done),
                                     "logprobs": self._logprobs(choice.logprobs) if choice.logprobs else None}
            if self.api == "chat":
                entry["message"], called = message(text, self.reading, call_ids(self.id, choice.index))
                entry["finish_reason"] = finish_reason(done, called)
            else:
                entry["text"] = text
            if self.return_token_ids:
                entry["token_ids"] = list(done.tokens)
            if len(self.choices) > 1:
                entry["tfd"] = {**_stats(done), "cached_tokens": done.cached_tokens}
            choices.append(entry)
        return self._envelope(self.object, choices, finished)

    def first_chunks(self) -> list[dict[str, Any]]:
        """A stream's opening chunks, one a choice: the assistant's role (chat) with no text yet."""
        chunks = []
        for choice in self.choices:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if self.api == "chat" \
                else {"text": ""}
            chunk = self._chunk(choice.index, delta)
            if self.return_token_ids and choice.index == 0:
                chunk["prompt_token_ids"] = list(self.prompt)
            chunks.append(chunk)
        return chunks

    def delta_chunks(self, event: Emitted, index: int = 0) -> list[dict[str, Any]]:
        """The chunks of one of a choice's events: its message deltas, the first carrying the event's
        logprobs and token ids (a chunk of its own when no text is settled yet)."""
        choice = self.choices[index]
        deltas: list[dict[str, Any]]
        if choice.stream is None:
            deltas = [{"text": event.text}] if event.text else []
        else:
            deltas = choice.stream.feed(event.text)
        extra = event.logprobs or self.return_token_ids
        if not deltas and extra:
            deltas = [{"content": ""} if self.api == "chat" else {"text": ""}]
        chunks = [self._chunk(index, delta) for delta in deltas]
        if chunks and extra:
            first = chunks[0]["choices"][0]
            if event.logprobs:
                first["logprobs"] = self._logprobs(event.logprobs)
            if self.return_token_ids:
                first["token_ids"] = list(event.tokens)
        return chunks

    def last_chunks(self, finished: Finished, index: int = 0) -> list[dict[str, Any]]:
        """A choice's last chunks: what its text held back, then ``finish_reason`` and the tfd block;
        the usage only in ``usage_chunk``, when the request asks for it (as OpenAI streams)."""
        choice = self.choices[index]
        if choice.stream is None:
            deltas = [{"text": finished.text}]
            called = False
        else:
            deltas = choice.stream.feed(finished.text) + choice.stream.finish()
            called = choice.stream.called
        chunks = [self._chunk(index, delta) for delta in deltas[:-1]]
        last = deltas[-1] if deltas else {}
        chunk = self._chunk(index, last, finish=finish_reason(finished, called))
        chunk["tfd"] = _stats(finished)
        return [*chunks, chunk]

    def usage_chunk(self, finished: Sequence[Finished]) -> dict[str, Any]:
        """``stream_options.include_usage``: a last chunk with no choices and the usage."""
        return {"id": self.id, "object": self._chunk_object, "created": self.created, "model": self.model,
                "choices": [], "usage": self._usage(finished)}

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.api == "chat" else "text_completion"

    def _chunk(self, index: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index, "finish_reason": finish, "logprobs": None}
        if self.api == "chat":
            choice["delta"] = delta
        else:
            choice.update(delta)
        return {"id": self.id, "object": self._chunk_object, "created": self.created, "model": self.model,
                "choices": [choice]}

    def _envelope(self, kind: str, choices: list[dict[str, Any]], finished: Sequence[Finished]
                  ) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                                "choices": choices, "usage": self._usage(finished),
                                "tfd": _stats(finished[0])}
        if self.return_token_ids:
            body["prompt_token_ids"] = list(self.prompt)
        return body

    def _usage(self, finished: Sequence[Finished]) -> dict[str, Any]:
        generated = sum(len(done.tokens) for done in finished)
        return {"prompt_tokens": len(self.prompt), "completion_tokens": generated,
                "total_tokens": len(self.prompt) + generated,
                "prompt_tokens_details": {"cached_tokens": finished[0].cached_tokens}}

    def _logprobs(self, entries: tuple[TokenLogprob, ...] | list[TokenLogprob]) -> dict[str, Any]:
        def text(token: int) -> str:
            return self.tokenizer.decode([token], skip_special_tokens=False)

        if self.api == "chat":
            return {"content": [{
                "token": text(e.token), "logprob": e.logprob, "bytes": list(text(e.token).encode()),
                "top_logprobs": [{"token": text(t), "logprob": v, "bytes": list(text(t).encode())}
                                 for t, v in e.top],
            } for e in entries]}
        return {"tokens": [text(e.token) for e in entries], "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{text(t): v for t, v in e.top} for e in entries]}


def _stats(finished: Finished) -> dict[str, Any]:
    return {"token_sha": finished.token_sha, "drafted": finished.drafted, "accepted": finished.accepted,
            "rounds": finished.rounds, "narrowest_window": finished.narrowest,
            "time_to_first_token": finished.time_to_first_token}


def finish_reason(finished: Finished, called: bool = False) -> str:
    """OpenAI's finish reason: ``tool_calls`` for a reply that ended by itself having made calls."""
    if called and finished.reason == "stop":
        return "tool_calls"
    return finished.reason

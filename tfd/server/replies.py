"""OpenAI reply objects, built from the engine's events: whole replies and stream chunks.

One ``Reply`` follows one request: it keeps the text and tokens so far and writes the JSON the
chat or completions API gives under the request's id (``tfd.server.access``: the engine's too),
with ``usage`` and the ``tfd`` block (``token_sha`` of the reply's token ids, draft counts, time to
first token).
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

import tokenizers

from tfd.engine.request import Emitted, Finished, TokenLogprob

Api = Literal["chat", "completion"]


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


class Reply:
    def __init__(self, api: Api, request_id: str, model: str, prompt: tuple[int, ...],
                 tokenizer: tokenizers.Tokenizer, return_token_ids: bool) -> None:
        self.api = api
        self.id = request_id
        self.model = model
        self.prompt = prompt
        self.tokenizer = tokenizer
        self.return_token_ids = return_token_ids
        self.created = int(time.time())
        self.text: list[str] = []
        self.logprobs: list[TokenLogprob] = []

    @property
    def object(self) -> str:
        if self.api == "chat":
            return "chat.completion"
        return "text_completion"

    def add(self, event: Emitted) -> None:
        self.text.append(event.text)
        self.logprobs.extend(event.logprobs or ())

    def whole(self, finished: Finished) -> dict[str, Any]:
        """The non-streamed reply."""
        text = "".join(self.text) + finished.text
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason(finished),
                                  "logprobs": self._logprobs(self.logprobs) if self.logprobs else None}
        if self.api == "chat":
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        if self.return_token_ids:
            choice["token_ids"] = list(finished.tokens)
        return self._envelope(self.object, [choice], finished)

    def first_chunk(self) -> dict[str, Any]:
        """A stream's opening chunk: the assistant's role (chat) with no text yet."""
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if self.api == "chat" else {"text": ""}
        chunk = self._chunk(delta)
        if self.return_token_ids:
            chunk["prompt_token_ids"] = list(self.prompt)
        return chunk

    def delta_chunk(self, event: Emitted) -> dict[str, Any]:
        delta: dict[str, Any] = {"content": event.text} if self.api == "chat" else {"text": event.text}
        chunk = self._chunk(delta, logprobs=self._logprobs(event.logprobs) if event.logprobs else None)
        if self.return_token_ids:
            chunk["choices"][0]["token_ids"] = list(event.tokens)
        return chunk

    def last_chunk(self, finished: Finished) -> dict[str, Any]:
        """The chunk with ``finish_reason`` (and the held-back text) and the tfd block; the usage only
        in ``usage_chunk``, when the request asks for it (as OpenAI streams)."""
        text = finished.text
        delta: dict[str, Any] = ({"content": text} if text else {}) if self.api == "chat" else {"text": text}
        chunk = self._chunk(delta, finish=finish_reason(finished))
        chunk["tfd"] = self._totals(finished)["tfd"]
        return chunk

    def usage_chunk(self, finished: Finished) -> dict[str, Any]:
        """``stream_options.include_usage``: a last chunk with no choices and the usage."""
        return {"id": self.id, "object": self._chunk_object, "created": self.created, "model": self.model,
                "choices": [], "usage": self._totals(finished)["usage"]}

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.api == "chat" else "text_completion"

    def _chunk(self, delta: dict[str, Any], finish: str | None = None,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": logprobs}
        if self.api == "chat":
            choice["delta"] = delta
        else:
            choice.update(delta)
        return {"id": self.id, "object": self._chunk_object, "created": self.created, "model": self.model,
                "choices": [choice]}

    def _envelope(self, kind: str, choices: list[dict[str, Any]], finished: Finished) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                                "choices": choices, **self._totals(finished)}
        if self.return_token_ids:
            body["prompt_token_ids"] = list(self.prompt)
        return body

    def _totals(self, finished: Finished) -> dict[str, Any]:
        generated = len(finished.tokens)
        return {
            "usage": {"prompt_tokens": len(self.prompt), "completion_tokens": generated,
                      "total_tokens": len(self.prompt) + generated,
                      "prompt_tokens_details": {"cached_tokens": finished.cached_tokens}},
            "tfd": {"token_sha": finished.token_sha, "drafted": finished.drafted,
                    "accepted": finished.accepted, "rounds": finished.rounds,
                    "narrowest_window": finished.narrowest,
                    "time_to_first_token": finished.time_to_first_token},
        }

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


def finish_reason(finished: Finished) -> str:
    return "cancelled" if finished.reason == "cancelled" else finished.reason

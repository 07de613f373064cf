"""Token ids to reply text as they come, with stop strings.

Decoding the whole reply at every token is quadratic; decoding only the last few tokens (from a
prefix that is already settled) and keeping the text they add is not. Text ending in an
incomplete character (U+FFFD from a split UTF-8 sequence) waits for the next token. Text that
might be the start of a stop string is held back until it is known not to be one, so a client
never sees part of a stop string.
"""

from __future__ import annotations

from collections.abc import Sequence

import tokenizers

_PENDING = "\ufffd"


class Detokenizer:
    def __init__(self, tokenizer: tokenizers.Tokenizer, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.text = ""  # settled text of the reply so far
        self.sent = 0  # characters of ``text`` handed out
        self.stopped_at: int | None = None  # where a stop string begins in ``text``
        self._prefix = 0  # ids before this are settled and left out of the next decode
        self._read = 0  # ids before this were read into ``text``

    def add(self, tokens: Sequence[int]) -> str:
        """Read ``tokens``; return the text now safe to send. Check ``stopped_at`` after."""
        self.ids.extend(tokens)
        before = self._decode(self.ids[self._prefix:self._read])
        after = self._decode(self.ids[self._prefix:])
        if len(after) > len(before) and not after.endswith(_PENDING):
            self.text += after[len(before):]
            self._prefix, self._read = self._read, len(self.ids)
        return self._release()

    def finish(self) -> str:
        """The rest of the text: everything left, cut at a stop string if one was hit."""
        if self.stopped_at is None:
            self.text = self._decode(self.ids)
            self._find_stop()
        end = len(self.text) if self.stopped_at is None else self.stopped_at
        rest = self.text[self.sent:end]
        self.sent = max(self.sent, end)
        return rest

    def _release(self) -> str:
        self._find_stop()
        end = self.stopped_at if self.stopped_at is not None else len(self.text) - self._partial_stop()
        out = self.text[self.sent:end]
        self.sent = max(self.sent, end)
        return out

    def _find_stop(self) -> None:
        if self.stopped_at is not None or not self.stop:
            return
        # Only text after what was sent can hold a new stop string (sent text held none).
        start = max(0, self.sent - max(map(len, self.stop)) + 1)
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if hits:
            self.stopped_at = min(hits)

    def _partial_stop(self) -> int:
        """Length of the longest end of ``text`` that could begin a stop string."""
        longest = 0
        for stop in self.stop:
            for size in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True) if ids else ""

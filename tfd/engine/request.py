"""What a client asks the engine for, and what the engine tells it back.

Requests cross from the trio side to the engine thread; events cross back once per step. All are
immutable records, safe to share between the two threads.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import attrs

if TYPE_CHECKING:
    from tfd.engine.grammar import Grammar

FinishReason = Literal["stop", "length", "cancelled", "failed"]


@attrs.frozen
class Sampling:
    """How a token is drawn. ``temperature`` 0 is greedy; ``seed`` None derives one from the
    prompt; ``logprobs`` is how many alternatives to report per token (None: no logprobs);
    ``bias``: (token, value) pairs added to those tokens' logits before anything else (OpenAI's
    ``logit_bias``; the log-probabilities reported stay the model's); the penalties then read the
    lane's own tokens only (its prompt for the repetition penalty, its draws for all three), as
    vLLM applies them."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    seed: int | None = None
    logprobs: int | None = None
    bias: tuple[tuple[int, float], ...] = ()
    frequency_penalty: float = 0.0  # less each time a token was drawn before
    presence_penalty: float = 0.0  # less once a token was drawn before
    repetition_penalty: float = 1.0  # a token of the prompt or drawn before: its logit divided (or times)


@attrs.frozen
class Request:
    """One generation: ``window`` = prompt + ``max_tokens`` rows are promised at admission."""

    id: str
    prompt: tuple[int, ...]
    max_tokens: int
    sampling: Sampling = Sampling()
    stop: tuple[str, ...] = ()  # stop strings; the text ends before the first one
    stop_ids: tuple[int, ...] = ()  # tokens that end the reply (EOS), kept in the token ids
    arrived: float = 0.0  # monotonic time the server received it
    draft: bool = True  # MTP drafts where the server drafts; False: the serial reference
    keep_at: tuple[int, ...] = ()  # prompt positions to keep states near (a chat's latest user message)
    cache: bool = True  # resume from kept states and keep new ones; False: prefilled as without a cache
    min_tokens: int = 0  # tokens drawn before a stop token may be (stop strings are not held)
    # a request of the same prompt admitted before this one: this one waits until that one's prompt is
    # through, and resumes from the state it kept (a request's choices share one prefill)
    after: str | None = None
    grammar: Grammar | None = None  # what the reply must follow: each draw masked to what it allows

    @property
    def window(self) -> int:
        return len(self.prompt) + self.max_tokens


@attrs.frozen
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # the best alternatives, best first


@attrs.frozen
class Admitted:
    """The lane took its pages; its prefill starts."""

    prompt_tokens: int
    cached_tokens: int = 0


@attrs.frozen
class Emitted:
    """New tokens of the reply and the text they completed (text may lag a token or two)."""

    tokens: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprob, ...] | None = None


@attrs.frozen
class Finished:
    """The last event of a request. ``tokens`` are every reply token; ``text`` what was not
    emitted yet (the tail held back for a stop string)."""

    reason: FinishReason
    tokens: tuple[int, ...]
    text: str = ""
    message: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    time_to_first_token: float | None = None
    drafted: int = 0  # MTP drafts verified
    accepted: int = 0  # drafts that held
    rounds: int = 0  # steps that gave tokens: one a token without drafts
    narrowest: int | None = None  # the narrowest verify window (rows), when it drafted

    @property
    def token_sha(self) -> str:
        return token_sha(self.tokens)


Event = Admitted | Emitted | Finished


def token_sha(tokens: Sequence[int]) -> str:
    """sha256 of the token ids as little-endian unsigned 32-bit integers."""
    return hashlib.sha256(struct.pack(f"<{len(tokens)}I", *tokens)).hexdigest()


def prompt_seed(prompt: Sequence[int]) -> int:
    """The seed of a request that gave none: from its prompt, so a repeat draws the same."""
    digest = hashlib.sha256(struct.pack(f"<{len(prompt)}I", *prompt)).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)

"""Drafts and their acceptance: what a verify round keeps, copy drafts, and a lane's draft counts.

Pure Python, no tensors. A round verifies a window of rows: the lane's pending token, then its drafts
d_1 .. d_n. Row i's logits draw the token s_i that goes after it, keyed by its absolute position, so
s_i is the token serial decoding would draw there as long as every row before it holds the serial
token. Hence ``kept``: row 0 always counts; row i + 1 counts while d_(i+1) == s_i; an EOS drawn
ends the round (nothing after it is serial). The lane commits its ``kept`` rows and emits
s_0 .. s_(kept - 1), so its tokens are the serial tokens whatever was drafted: drafts only change
how many come a round.

Copy drafts propose, when the context's last ``match`` tokens occurred before, the tokens that
followed that earlier occurrence (the latest one); a model with no head (or beside it) gets drafts
for free where text repeats.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import attrs

COPY_MATCH = 8  # tokens of the context's end that must have occurred before, for a copy draft


def kept(drafts: Sequence[int], sampled: Sequence[int], stops: Collection[int]) -> int:
    """Rows of a verify window to keep: ``sampled[i]`` is the token drawn at row i (the window is the
    pending token, then ``drafts``; ``len(sampled) == len(drafts) + 1``); a draft is kept while it
    equals the token drawn before it and that token is no stop. ValueError for mismatched lengths."""
    if len(sampled) != len(drafts) + 1:
        raise ValueError(f"a window of {len(drafts)} drafts draws {len(drafts) + 1} tokens, "
                         f"got {len(sampled)}")
    count = 1
    for draft, drawn in zip(drafts, sampled, strict=False):
        if drawn in stops or draft != drawn:
            break
        count += 1
    return count


def copy_drafts(context: Sequence[int], limit: int, match: int = COPY_MATCH) -> list[int]:
    """Up to ``limit`` tokens that followed the latest earlier occurrence of the context's last
    ``match`` tokens (none when they did not occur before, or ``limit`` is 0)."""
    if limit <= 0 or match <= 0 or len(context) <= match:
        return []
    tail = list(context[-match:])
    first = tail[0]
    for start in range(len(context) - match - 1, -1, -1):  # latest first; an overlap with the tail is fine
        if context[start] == first and list(context[start:start + match]) == tail:
            follow = start + match
            return list(context[follow:follow + limit])
    return []


@attrs.define
class DraftCounts:
    """A lane's drafting so far: rounds, drafts proposed, drafts accepted, and the narrowest window
    verified (rows), for the reply's ``tfd`` block, admin ``lanes`` and ``/metrics``."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    narrowest: int | None = None

    def add(self, drafts: int, kept_rows: int) -> None:
        """One round of ``drafts`` drafts whose window kept ``kept_rows`` rows (1 to drafts + 1)."""
        if not 1 <= kept_rows <= drafts + 1:
            raise ValueError(f"a window of {drafts} drafts keeps 1 to {drafts + 1} rows, got {kept_rows}")
        self.rounds += 1
        self.drafted += drafts
        self.accepted += kept_rows - 1
        window = drafts + 1
        self.narrowest = window if self.narrowest is None else min(self.narrowest, window)

    @property
    def rate(self) -> float | None:
        """Accepted drafts over drafted ones (None before any draft)."""
        return self.accepted / self.drafted if self.drafted else None

"""The load generator's arithmetic: latency statistics, a request's stream timings, arrivals, lengths.

Pure Python (no torch, no I/O), so ``tfd bench --serve`` starts fast on a machine without a GPU.
Times are seconds of one monotonic clock (trio's, in the client); the statistics it reports are
milliseconds.

A streamed request's timings follow vLLM's ``bench serve``: TTFT is from the request's send to its
first chunk that carries a token; each inter-token latency (ITL) is the gap between two successive
token-bearing chunks (a chunk carries one engine step's tokens: several when drafts are accepted);
TPOT is ``(last token chunk - first token chunk) / (tokens - 1)``, the mean time of each token after
the first, so drafting lowers it where it lowers nothing in the ITL count.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import attrs


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0 to 100) of ``ordered`` (sorted ascending), interpolated linearly
    between the closest ranks (numpy's default); NaN for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"a percentile is 0 to 100, not {q}")
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@attrs.frozen
class Summary:
    """A distribution in milliseconds: what every run reports for TTFT, TPOT and ITL."""

    count: int
    mean: float
    min: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Summary:
        """The summary of ``seconds`` (any order), in milliseconds; NaN fields when empty."""
        ms = sorted(value * 1e3 for value in seconds)
        if not ms:
            return cls(0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
        return cls(len(ms), math.fsum(ms) / len(ms), ms[0], percentile(ms, 50), percentile(ms, 90),
                   percentile(ms, 99), ms[-1])

    def as_json(self) -> dict[str, float | int | None]:
        """JSON has no NaN: an empty distribution's fields are null."""
        return {name: None if isinstance(value, float) and math.isnan(value) else value
                for name, value in attrs.asdict(self).items()}


@attrs.define
class Timeline:
    """One streamed request as the client saw it: when it was sent and when each token-bearing chunk
    arrived with how many tokens."""

    sent: float
    arrivals: list[float] = attrs.Factory(list)
    counts: list[int] = attrs.Factory(list)

    def add(self, at: float, tokens: int) -> None:
        if tokens > 0:  # the opening chunk (role, prompt ids) and the usage chunk carry none
            self.arrivals.append(at)
            self.counts.append(tokens)

    @property
    def tokens(self) -> int:
        return sum(self.counts)

    def ttft(self) -> float | None:
        return self.arrivals[0] - self.sent if self.arrivals else None

    def tpot(self, tokens: int | None = None) -> float | None:
        """Mean seconds a token after the first (``tokens``: the reply's count, by default the chunks'
        sum); None for fewer than two tokens."""
        tokens = self.tokens if tokens is None else tokens
        if tokens < 2 or not self.arrivals:
            return None
        return (self.arrivals[-1] - self.arrivals[0]) / (tokens - 1)

    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]


def poisson_arrivals(rate: float, count: int, seed: int) -> list[float]:
    """``count`` arrival times (seconds from the start, the first at 0) of a Poisson process of
    ``rate`` requests a second: exponential gaps of mean ``1 / rate`` drawn from ``seed`` alone."""
    if not rate > 0 or not math.isfinite(rate):
        raise ValueError(f"a rate is a positive number of requests a second, not {rate}")
    draw = random.Random(seed)
    times, now = [], 0.0
    for number in range(count):
        if number:
            now += draw.expovariate(rate)
        times.append(now)
    return times


def lengths(span: tuple[int, int], count: int, draw: random.Random) -> list[int]:
    """``count`` lengths drawn uniformly from ``span`` (low, high; both included)."""
    low, high = span
    return [low if low == high else draw.randint(low, high) for _ in range(count)]

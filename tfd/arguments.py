"""Value types of the command line's own flags (argparse ``type=``): each refuses by
``argparse.ArgumentTypeError`` saying what it wants."""

from __future__ import annotations

import argparse
import math


def counts(text: str) -> list[int]:
    """``N[,N...]``, each positive."""
    return [positive(part) for part in text.split(",")]


def span(text: str) -> tuple[int, int]:
    """``N`` or ``LOW:HIGH`` (positive, LOW at most HIGH)."""
    low, _, high = text.partition(":")
    found = (positive(low), positive(high) if high else positive(low))
    if found[0] > found[1]:
        raise argparse.ArgumentTypeError(f"a range is LOW:HIGH with LOW at most HIGH, got {text!r}")
    return found


def rates(text: str) -> list[float]:
    """``R[,R...]``, each a positive number."""
    return [positive_float(part) for part in text.split(",")]


def draft_counts(text: str) -> list[int]:
    """``N[,N...]``, each 0 to 8 (MTP drafts a round)."""
    found = []
    for part in text.split(","):
        try:
            count = int(part)
        except ValueError:
            count = -1
        if not 0 <= count <= 8:
            raise argparse.ArgumentTypeError(f"drafts a round are 0 to 8, got {part!r}")
        found.append(count)
    return found


def natural(text: str) -> int:
    """0 or more."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}")
    return int(text)


def positive_float(text: str) -> float:
    """A finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def positive(text: str) -> int:
    """1 or more."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return int(text)

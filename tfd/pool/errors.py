"""The pool's refusals. Each leaves the pool as it was."""

from __future__ import annotations


class PoolError(Exception):
    """A pool refusal; the pool is unchanged."""


class PoolShort(PoolError):
    """Not enough unpromised pages (or no lane slot) for a lane now; admission waits."""


class NoRun(PoolError):
    """No consecutive run of free pages is long enough, however many pages are free."""


class OverPromise(PoolError):
    """A lane asked for more than it was promised."""


class LeaseFinished(PoolError):
    """The lease was finished; its pages may belong to another lane now."""


class Leak(AssertionError):
    """The census differs from the census at load after every lane finished."""

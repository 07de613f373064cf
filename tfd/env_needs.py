"""Rules between rows that a row declares in its ``needs``: while it is on, another row's value must
lie above a number (``above``; unset counts as on: its auto) or at a number or more (``at_least``).

A row's ``needs`` is a list of TOML tables, each ``row`` (the other row), one bound and ``why`` (a
few words a refusal ends with). The table checks them once its values are read; each unmet one is a
problem naming both rows and the value that would do.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Need:
    """While the row that declares it is on, ``row``'s value is above ``above`` (None there: its
    auto, which is on) or at least ``at_least``; ``why`` ends the refusal."""

    row: str
    why: str
    above: float | None = None
    at_least: float | None = None

    def problem(self, given: str, value: object, target_given: str) -> str | None:
        """What is wrong with ``value`` (the other row's; ``target_given``: how it was given) while
        the declaring row is on as ``given``; None when nothing is."""
        if self.above is not None and value is not None and not _over(value, self.above):
            return f"{given} requires {self.row} above {_number(self.above)}: {self.why}"
        if self.at_least is not None and (value is None or _under(value, self.at_least)):
            return f"{target_given}: {given} needs {self.row}={_number(self.at_least)} or more ({self.why})"
        return None

    @property
    def bound(self) -> str:
        """The bound in words: ``above 0``, ``130 or more``."""
        if self.above is not None:
            return f"above {_number(self.above)}"
        return f"{_number(self.at_least)} or more"

    def describe(self) -> str:
        """The rule for people (docs/environment.md)."""
        return f"Needs `{self.row}` {self.bound} ({self.why})."


def needs_from_toml(name: str, spec: object) -> tuple[Need, ...]:
    """A row's ``needs`` as written in its TOML; ``TypeError`` (a bug in the table) when malformed."""
    if spec is None:
        return ()
    if not isinstance(spec, list):
        raise TypeError(f"{name}: `needs` must be a list of tables")
    found = []
    for item in spec:
        if not isinstance(item, dict) or set(item) - {"row", "why", "above", "at_least"} \
                or not isinstance(item.get("row"), str) or not isinstance(item.get("why"), str) \
                or ("above" in item) == ("at_least" in item) \
                or not all(isinstance(item.get(k, 0), int | float) for k in ("above", "at_least")):
            raise TypeError(f"{name}: each of `needs` is a row, a why and one bound (above or at_least)")
        found.append(Need(item["row"], item["why"], item.get("above"), item.get("at_least")))
    return tuple(found)


def _over(value: object, bound: float) -> bool:
    return isinstance(value, int | float) and value > bound


def _under(value: object, bound: float) -> bool:
    return isinstance(value, int | float) and value < bound


def _number(value: float | None) -> str:
    return f"{value:g}"

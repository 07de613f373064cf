"""The conformance kit's findings: a row a check, a table for people, JSON for ``--compare``.

A row is one check of one gate: its key (the gate and what the check varied: prompt, sampling,
concurrency, drafts, refusal), the value it saw (a reply's token sha, a refusal's status and code,
a census), whether the gate's rule held, and what was wrong when it did not. Two reports compare
key by key on their values: the same server twice, or two builds or settings of it, must agree.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

GATES = ("repeat", "concurrent", "drafted", "resumed", "refusals", "tools", "cancel", "evict")


@attrs.frozen
class Row:
    gate: str
    key: dict[str, Any]
    value: str
    ok: bool
    detail: str = ""

    @property
    def name(self) -> str:
        """The row's key as one string: the gate and what it varied, sorted."""
        return json.dumps({"gate": self.gate, **self.key}, sort_keys=True)


@attrs.frozen
class Report:
    url: str
    profile: str
    rows: tuple[Row, ...]
    skipped: dict[str, str] = attrs.field(factory=dict)  # gate -> why it did not run
    budget: int | None = None  # the model's sparse attention budget, where it has one
    lead: int = 0  # tokens every prompt began with, to pass that budget

    @property
    def ok(self) -> bool:
        """Every gate ran and held."""
        return bool(self.rows) and not self.skipped and all(row.ok for row in self.rows)

    def words(self) -> dict[str, Any]:
        return {"url": self.url, "profile": self.profile, "ok": self.ok, "skipped": self.skipped,
                "budget": self.budget, "lead": self.lead, "rows": [attrs.asdict(row) for row in self.rows]}

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.words(), indent=1) + "\n")


def read(path: Path) -> Report:
    """A report ``--json`` wrote (``ValueError`` naming the file when it is not one)."""
    try:
        words = json.loads(path.read_text())
        rows = tuple(Row(**row) for row in words["rows"])
        return Report(words["url"], words["profile"], rows, words.get("skipped", {}), words.get("budget"),
                      words.get("lead", 0))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a conformance report ({error})") from None


def table(report: Report) -> str:
    """One line a gate: its rows, how many failed, and the first failure's words."""
    lines = [f"tfd conformance {report.url} ({report.profile})"]
    if report.budget is not None:
        lines.append(f"prompts begin with {report.lead} tokens: past the model's sparse attention budget "
                     f"of {report.budget}")
    lines.append(f"{'gate':<11} {'rows':>5} {'failed':>6}  result")
    for gate in GATES:
        rows = [row for row in report.rows if row.gate == gate]
        if gate in report.skipped:
            lines.append(f"{gate:<11} {'':>5} {'':>6}  skipped: {report.skipped[gate]}")
            continue
        failed = [row for row in rows if not row.ok]
        result = "ok" if rows and not failed else (f"FAIL: {failed[0].detail}" if failed else "FAIL: no rows")
        lines.append(f"{gate:<11} {len(rows):>5} {len(failed):>6}  {result}")
    lines.append("every gate holds" if report.ok else "the contract does NOT hold")
    return "\n".join(lines)


@attrs.frozen
class Comparison:
    rows: tuple[int, int]  # rows in each report
    keys: int  # keys in both
    only: tuple[int, int]  # keys in one report alone
    differ: tuple[str, ...]  # keys whose values differ

    def words(self) -> str:
        return (f"{self.rows[0]} and {self.rows[1]} rows, {self.keys} keys in both, "
                f"{len(self.differ)} differ; {self.only[0]} and {self.only[1]} keys in one alone")


def compare(first: Report, second: Report) -> Comparison:
    """Two reports, key by key: a key's value is what its rows saw (the same key seen twice in a
    report, e.g. repeats, must see one value)."""
    ours, theirs = _values(first.rows), _values(second.rows)
    both = sorted(set(ours) & set(theirs))
    differ = tuple(key for key in both if ours[key] != theirs[key])
    return Comparison((len(first.rows), len(second.rows)), len(both),
                      (len(set(ours) - set(theirs)), len(set(theirs) - set(ours))), differ)


def _values(rows: Iterable[Row]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for row in rows:
        found.setdefault(row.name, set()).add(row.value)
    return found

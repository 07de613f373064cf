"""docs/architecture.md stays true to the tree: a row for every module and none for a module gone, each
row at most two lines (220 characters)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROW_MOST = 220  # two lines of a wide terminal


def rows(text: str) -> dict[str, str]:
    """The module table's rows: module path to its description."""
    return {match[1]: match[2] for match in re.finditer(r"^\| `((?:tfd|kernels)/[^`]+\.py)` \| (.*) \|$",
                                                         text, re.M)}


def problems(text: str, modules: set[str]) -> list[str]:
    found = rows(text)
    said = [f"no row for {module}" for module in sorted(modules - set(found))]
    said += [f"a row for {module}, which is gone" for module in sorted(set(found) - modules)]
    said += [f"{module}: {len(job)} characters" for module, job in sorted(found.items())
             if len(job) > ROW_MOST]
    return said


def test_every_module_has_one_short_row() -> None:
    files = [*ROOT.glob("tfd/**/*.py"), *ROOT.glob("kernels/**/*.py")]
    modules = {str(path.relative_to(ROOT)) for path in files if path.name != "__init__.py"}
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert len(rows(text)) == len(modules) > 100
    assert problems(text, modules) == []


def test_a_missing_a_stale_and_a_long_row_are_named() -> None:
    text = "\n".join([f"| `tfd/a.py` | {'x' * ROW_MOST} |", f"| `tfd/b.py` | {'x' * (ROW_MOST + 1)} |",
                      "| `tfd/gone.py` | once |"])
    assert problems(text, {"tfd/a.py", "tfd/b.py", "tfd/new.py"}) == [
        "no row for tfd/new.py", "a row for tfd/gone.py, which is gone",
        f"tfd/b.py: {ROW_MOST + 1} characters"]

"""The README's two set-up commands exist, one each, and .ci/run finds the test one."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def command_after(marker: str) -> str:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert lines.count(marker) == 1, marker
    return lines[lines.index(marker) + 1]


def test_two_setup_commands_each_make_their_venv() -> None:
    serve = command_after("# run the daemon")
    test = command_after("# run the tests")
    for command in (serve, test):
        assert command.startswith("python3 -m venv .venv && ")
        assert "pip install -q torch==2.13.0" in command
    assert serve.endswith(".venv/bin/tfd serve")
    assert "-m pytest" in test


def test_ci_runs_the_readme_test_command() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    extract = next(line for line in script.splitlines() if line.startswith("command="))
    found = subprocess.run(["bash", "-c", f"{extract}; printf %s \"$command\""], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout
    assert found == command_after("# run the tests")

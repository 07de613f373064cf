"""``tfd conformance`` against a real daemon (the tiny Qwen3.5 checkpoint with a drafting head): every
gate holds through the HTTP API and the admin socket, the JSON report keeps every row's key and
value, and two runs compare equal key by key; without the admin socket the run does not pass."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import ServedDaemon, tiny_server
from tfd.cli import main
from tfd.conformance import report
from tfd.conformance.report import Report, Row


@pytest.fixture(scope="module")
def server() -> Iterator[ServedDaemon]:
    with tiny_server("qwen3_5", head=True, TF_DRAFTS="1", TF_MTP_DRAFTS="2", TF_MTP_CONFIDENCE="0") as daemon:
        yield daemon


def kit(*args: str) -> int:
    with pytest.raises(SystemExit) as ended:
        main(["conformance", *args])
    return int(ended.value.code or 0)


def test_every_gate_holds_and_two_runs_agree(server: ServedDaemon, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    for out in (first, second):
        assert kit("--url", server.url(), "--admin", str(server.admin), "--json", str(out)) == 0
    printed = capsys.readouterr().out
    assert "every gate holds" in printed
    for gate in report.GATES:
        assert f"\n{gate}" in printed
    words = json.loads(first.read_text())
    assert words["ok"] is True and words["skipped"] == {}
    gates = {row["gate"] for row in words["rows"]}
    assert gates == set(report.GATES)
    concurrent = [row for row in words["rows"] if row["gate"] == "concurrent"]
    assert {row["key"]["concurrency"] for row in concurrent} == {1, 2, 4}
    assert all(len(row["value"]) == 64 for row in concurrent)  # token shas
    assert kit("--compare", str(first), str(second)) == 0
    compared = capsys.readouterr().out
    keys = len({Row(**row).name for row in words["rows"]})
    rows = len(json.loads(second.read_text())["rows"])
    assert f"{len(words['rows'])} and {rows} rows, {keys} keys in both, 0 differ" in compared


def test_a_run_without_the_admin_socket_does_not_pass(server: ServedDaemon,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert kit("--url", server.url()) == 1
    printed = capsys.readouterr().out
    assert "cancel" in printed and "skipped: no --admin socket" in printed
    assert "the contract does NOT hold" in printed


def test_compare_names_the_keys_that_differ(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    row = Row("repeat", {"prompt": 0, "sampling": "greedy"}, "a" * 64, True)
    Report("u", "quick", (row,)).write(tmp_path / "a.json")
    Report("u", "quick", (Row(row.gate, row.key, "b" * 64, True),)).write(tmp_path / "b.json")
    assert kit("--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")) == 1
    out = capsys.readouterr().out
    assert "1 and 1 rows, 1 keys in both, 1 differ" in out and '"sampling": "greedy"' in out
    (tmp_path / "c.json").write_text("{}")
    with pytest.raises(ValueError, match=r"c\.json: not a conformance report"):
        report.read(tmp_path / "c.json")


def test_an_unreachable_server_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert kit("--url", "http://127.0.0.1:9") == 1
    assert "http://127.0.0.1:9" in capsys.readouterr().err

"""``tfd conformance`` against a real daemon (the demo model, its trained head drafting): every gate
holds through the HTTP API and the admin socket, the JSON report keeps every row's key and value,
two runs compare equal key by key, and so do runs with drafts on and off; without the admin socket
the run does not pass. Every family's tiny checkpoint passes too, Flash Next's with every prompt past its
sparse attention budget."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from tiny_models import FAMILIES

from support import ServedDaemon, started_server, tiny_server
from tfd.cli import main
from tfd.conformance import report
from tfd.conformance.report import Report, Row


@pytest.fixture(scope="module")
def server() -> Iterator[ServedDaemon]:
    with started_server() as daemon:
        yield daemon


@pytest.fixture(scope="module")
def first_run(server: ServedDaemon, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quick profile's report of the demo server (drafting), once for the module; what it
    printed beside it (``a.txt``)."""
    out = tmp_path_factory.mktemp("kit") / "a.json"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        status = kit("--url", server.url(), "--admin", str(server.admin), "--json", str(out))
    assert status == 0, printed.getvalue()
    out.with_suffix(".txt").write_text(printed.getvalue())
    return out


@pytest.fixture(scope="module")
def second_run(server: ServedDaemon, first_run: Path, tmp_path_factory: pytest.TempPathFactory
               ) -> tuple[int, str, Path]:
    """The quick profile again on the same server, now warm (its prompt cache holds the first run's
    turns), without the admin socket: its exit status, what it printed and its report."""
    out = tmp_path_factory.mktemp("kit") / "b.json"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        status = kit("--url", server.url(), "--json", str(out))
    return status, printed.getvalue(), out


def told(daemon: ServedDaemon, capsys: pytest.CaptureFixture[str]) -> str:
    """A failed run's words and the daemon's log: a server that stopped says why."""
    printed = capsys.readouterr()
    code = daemon.proc.poll() if daemon.proc is not None else None
    state = "still runs" if code is None else f"exited with {code}"
    return f"{printed.out}{printed.err}\n--- the daemon ({state}): its log ---\n{daemon.log()[-4000:]}"


def kit(*args: str) -> int:
    with pytest.raises(SystemExit) as ended:
        main(["conformance", *args])
    return int(ended.value.code or 0)


def test_every_gate_holds_and_two_runs_agree(server: ServedDaemon, first_run: Path,
                                             second_run: tuple[int, str, Path],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    words = json.loads(first_run.read_text())
    assert words["ok"] is True and words["skipped"] == {}, told(server, capsys)
    printed = first_run.with_suffix(".txt").read_text()
    assert "every gate holds" in printed
    for gate in report.GATES:
        assert f"\n{gate}" in printed
    gates = {row["gate"] for row in words["rows"]}
    assert gates == set(report.GATES)
    concurrent = [row for row in words["rows"] if row["gate"] == "concurrent"]
    assert {row["key"]["concurrency"] for row in concurrent} == {1, 2, 4}
    assert all(len(row["value"]) == 64 for row in concurrent)  # token shas
    assert (words["budget"], words["lead"]) == (None, 0)  # the Qwen3.5 demo attends every position
    # the second run, warm and without the admin socket: every row it has is the first run's
    second = json.loads(second_run[2].read_text())["rows"]
    alone = {Row(**row).name for row in words["rows"] if row["gate"] in ("cancel", "evict")}
    keys = len({Row(**row).name for row in words["rows"]}) - len(alone)
    assert kit("--compare", str(first_run), str(second_run[2])) == 0
    compared = capsys.readouterr().out
    assert f"{len(words['rows'])} and {len(second)} rows, {keys} keys in both, 0 differ; " \
        f"{len(alone)} and 0 keys in one alone" in compared, compared


def test_runs_with_drafts_on_and_off_agree(first_run: Path, served: type[ServedDaemon], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    plain = served(TF_DRAFTS="0").start(timeout=120)
    drafted, serial = first_run, tmp_path / "serial.json"
    assert kit("--url", plain.url(), "--admin", str(plain.admin), "--json", str(serial)) == 0
    drafts = [row["key"] for row in json.loads(drafted.read_text())["rows"] if row["gate"] == "drafted"]
    assert drafts and any(row.get("drafts") for row in drafts)
    assert kit("--compare", str(drafted), str(serial)) == 0
    assert " 0 differ; 0 and 0 keys in one alone" in capsys.readouterr().out


def test_a_run_without_the_admin_socket_does_not_pass(second_run: tuple[int, str, Path]) -> None:
    status, printed, out = second_run
    assert status == 1
    assert "cancel" in printed and "skipped: no --admin socket" in printed
    assert "the contract does NOT hold" in printed
    words = json.loads(out.read_text())
    assert words["skipped"] == {"cancel": "no --admin socket", "evict": "no --admin socket"}
    assert words["rows"] and all(row["ok"] for row in words["rows"]), printed  # what it could check holds


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


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_passes(family: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each family's tiny checkpoint with a drafting head, so every gate has drafts to check. Flash
    Next's attends its best 16 positions past a budget of 16: every prompt begins with a lead past
    it; the other families have no such budget, and their prompts no lead."""
    out = tmp_path / "kit.json"
    with tiny_server(family, head=True, TF_DRAFTS="1", TF_MTP_DRAFTS="2", TF_MTP_CONFIDENCE="0") as daemon:
        budget = daemon.get("/v1/models").json()["data"][0].get("sparse_attention_budget")
        ran = kit("--url", daemon.url(), "--admin", str(daemon.admin), "--json", str(out))
        assert ran == 0, told(daemon, capsys)
    found = report.read(out)
    if family != "qwen4_exp":
        assert budget is None and (found.budget, found.lead) == (None, 0)
        return
    assert budget == found.budget == 16 and 16 + 16 <= found.lead < 2 * (16 + 16)
    assert f"prompts begin with {found.lead} tokens: past the model's sparse attention budget of 16" in \
        capsys.readouterr().out


def test_a_soak_of_random_requests_and_cancels_holds(server: ServedDaemon, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "soak.json"
    # bounded by requests, not by this machine's speed: the time is only a cap
    assert kit("--url", server.url(), "--admin", str(server.admin), "--soak", "3600", "--clients", "4",
               "--requests", "22", "--json", str(out)) == 0, told(server, capsys)
    assert "soak holds" in capsys.readouterr().out
    words = json.loads(out.read_text())
    assert words["ok"] is True and words["failures"] == 0 and words["leaks"] == {}
    assert words["requests"] == 22 and words["tokens"] > 0 and words["answers"]["200"] > 0
    assert words["left"] > 0  # the fourth client's first request leaves (its draws are seeded)
    assert set(words["memory"]) == {"start", "settled", "end"} and words["memory"]["end"]["rss_bytes"] > 0
    assert words["flat"] is None  # no --flat: memory reported, not gated


def test_a_soak_holds_memory_flat_only_within_its_limit() -> None:
    from tfd.conformance.soak import SoakReport

    def report(end: int, flat: float | None = 0.02) -> SoakReport:
        memory = {"start": {"rss_bytes": 900}, "settled": {"rss_bytes": 1000}, "end": {"rss_bytes": end}}
        return SoakReport(60.0, 4, 10, 100, 0, {"200": 10}, 0, {}, memory, flat)

    assert report(1019).ok and report(1019).growth == {"rss_bytes": pytest.approx(0.019)}
    assert not report(1021).ok  # 2.1% past settled (the ramp from the start, 900, is not counted)
    assert report(1021, flat=None).ok and report(1000).ok and report(990).ok
    assert "rss_bytes +2.10% (at most 2% each)" in "\n".join(report(1021).lines())


def test_a_soak_needs_the_admin_socket(server: ServedDaemon) -> None:
    assert kit("--url", server.url(), "--soak", "1") == 2


def test_a_context_too_short_to_pass_the_budget_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with started_server(TF_DEMO="flashnext", TF_CONTEXT="192") as daemon:
        assert daemon.get("/v1/models").json()["data"][0]["sparse_attention_budget"] == 64
        assert kit("--url", daemon.url(), "--admin", str(daemon.admin)) == 1
        assert "holds no conversation past its sparse attention budget of 64" in capsys.readouterr().err

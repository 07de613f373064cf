"""A weights load's progress: the reports a listener hears, and systemd's STATUS= while a daemon loads."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
import trio

from support import CACHE, ServedDaemon
from tfd.checkpoint import Checkpoint
from tfd.loading import GIB, KIB, MIB, LoadProgress, Progress, reporting

STATUS = re.compile(r"STATUS=loading weights: (\d+) of (\d+) files?, ([\d.]+) of ([\d.]+) (KiB|MiB|GiB)")


def test_a_progress_line_counts_files_and_bytes_in_the_total_s_unit() -> None:
    assert LoadProgress(3, 8, int(12.1 * GIB), 18 * GIB).line() == "3 of 8 files, 12.1 of 18.0 GiB"
    assert LoadProgress(0, 1, 0, 3 * MIB // 2).line() == "0 of 1 file, 0.0 of 1.5 MiB"
    assert LoadProgress(2, 2, 512 * KIB, 512 * KIB).line() == "2 of 2 files, 512.0 of 512.0 KiB"


def test_the_progress_bar_redraws_at_most_ten_times_a_second() -> None:
    now = [0.0]
    stream = io.StringIO()
    bar = Progress(4_000_000, 1, stream, clock=lambda: now[0])
    for _ in range(40):  # 40 tensors of 100 kB, 10 ms apart: 0.4 s
        now[0] += 0.01
        bar.advance(100_000)
    bar.close()
    frames = stream.getvalue().split("\r")[1:]
    assert 4 <= len(frames) <= 6 and frames[-1].endswith("\n")
    assert frames[-1].split() == ["loading", "weights", "4.0", "/", "4.0", "MB", "100%", "10.0", "MB/s"]


def test_the_listener_hears_a_few_times_a_second_and_at_the_end() -> None:
    now = [0.0]
    heard: list[LoadProgress] = []
    with reporting(heard.append):
        progress = Progress(1000, 2, None, clock=lambda: now[0])
    for _ in range(100):  # 100 tensors over one second
        now[0] += 0.01
        progress.advance(5)
    progress.file_done()
    assert 1 <= len(heard) <= 1 / Progress.REPORT_S + 1
    progress.advance(500)
    progress.file_done()
    progress.close()
    assert heard[-1] == LoadProgress(2, 2, 1000, 1000)
    assert [h.done for h in heard] == sorted(h.done for h in heard)


def test_a_listener_that_raises_is_dropped_and_the_load_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    def broken(progress: LoadProgress) -> None:
        calls.append(progress)
        raise RuntimeError("gone")

    with reporting(broken):
        progress = Progress(10, 1, io.StringIO())
    progress.advance(10)
    progress.close()
    assert len(calls) == 1
    assert "the load progress listener failed" in caplog.text


def test_no_listener_outside_reporting() -> None:
    with reporting(lambda progress: None):
        pass
    assert Progress(1, 1, None).listener is None


async def test_a_worker_thread_reports_to_the_listener_of_its_caller(tmp_path: Path) -> None:
    import tiny_models

    checkpoint = Checkpoint.open(tiny_models.save_sharded("qwen3_5", CACHE / "tiny"))
    heard: list[LoadProgress] = []
    with reporting(heard.append):
        tensors = await trio.to_thread.run_sync(checkpoint.load, list(checkpoint.tensors))
    total = sum(info.nbytes for info in checkpoint.tensors.values())
    assert heard[-1] == LoadProgress(2, 2, total, total)
    assert set(tensors) == set(checkpoint.tensors)


def test_status_tells_the_weights_loading_file_by_file(served: type[ServedDaemon]) -> None:
    import tiny_models

    model = tiny_models.save_sharded("qwen3_5", CACHE / "tiny")
    daemon = served(TF_MODEL=str(model)).start(timeout=120)
    fields = [field for _, field in daemon.messages]
    reports = [(i, STATUS.fullmatch(field)) for i, field in enumerate(fields)
               if field.startswith("STATUS=loading weights")]
    assert reports and all(match for _, match in reports), fields
    before = fields.index("STATUS=loading the model")
    after = next(i for i, field in enumerate(fields) if field.startswith("STATUS=building the engine"))
    assert all(before < i < after for i, _ in reports)
    numbers = [(int(m[1]), int(m[2]), float(m[3]), float(m[4]), m[5]) for _, m in reports if m]
    assert [n[0] for n in numbers] == sorted(n[0] for n in numbers)
    assert [n[2] for n in numbers] == sorted(n[2] for n in numbers)
    files_done, files, done, total, _ = numbers[-1]
    assert (files_done, files) == (2, 2) and done == total
    checkpoint = Checkpoint.open(model)
    whole = LoadProgress(2, 2, *[sum(info.nbytes for info in checkpoint.tensors.values())] * 2)
    assert fields[reports[-1][0]] == f"STATUS=loading weights: {whole.line()}"

"""Fixtures shared by the whole suite."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import ServedDaemon


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A fresh directory with a short path: Unix socket paths must fit in 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="tfd-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def served(short_tmp: Path) -> Iterator[type[ServedDaemon]]:
    """A factory of `tfd serve` processes; every one started is stopped after the test."""
    started: list[ServedDaemon] = []

    class Factory(ServedDaemon):
        def __init__(self, **env: str) -> None:
            workdir = short_tmp / f"d{len(started)}"
            workdir.mkdir()
            super().__init__(workdir, **env)
            started.append(self)

    yield Factory
    for daemon in started:
        daemon.close()

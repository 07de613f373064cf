"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

# numpy's OpenBLAS picks its matrix kernel by the CPU, and some kernels sum a row in an order that follows
# its place in the tile: the interpreter's dot (numpy) then gives a row other bits alone than in a batch
# (an AMD EPYC's kernel broke three GEMM tests; the GPU's MMA has no such order). One kernel on every x86
# CPU, set before numpy loads, makes the interpreter's sums the same wherever the suite runs: set, not
# defaulted, since a host may name its own (one had OPENBLAS_CORETYPE=Haswell, whose kernel broke two).
os.environ["OPENBLAS_CORETYPE"] = "Sandybridge"
# One thread per process (this one and every `tfd serve` it starts): the tiny models' operations are
# too small to gain from more (the demo's drafting test ran 20% faster on one than on two), and the
# suite runs one process per core (pytest-xdist, addopts), so more threads would only compete.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

# Without a GPU, Triton kernels run in its interpreter (set before any kernel module is imported).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from support import ServedDaemon

if os.environ.get("TRITON_INTERPRET") == "1":
    # a jit helper's call patches triton.language anew in every program: a third of a kernel test's time
    import interpreted_calls

    interpreted_calls.install()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``--numprocesses=auto`` (addopts): a worker per core, at most 8 (past that the longest file
    bounds the run and each worker only adds its memory); none where CUDA is, whose tests share one
    device. PYTEST_XDIST_AUTO_NUM_WORKERS, where set, is xdist's to read."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    if torch.cuda.is_available():
        return 0
    return min(8, len(os.sched_getaffinity(0)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` skip cleanly where CUDA is absent."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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

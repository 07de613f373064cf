"""Kernel variants compiled while serving: counted through Triton's hook, logged, exported."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from support import clean_environ
from tfd.server.lifecycle import Lifecycle
from tfd.server.metrics import Metrics

HOOKED = """
from types import SimpleNamespace
from triton import knobs
seen = []
knobs.runtime.jit_post_compile_hook = lambda **info: seen.append(info["fn"].name)  # someone's own
from tfd_kernels.runtime import compiled_variants, watch_compiles
assert watch_compiles() and watch_compiles()  # once installed, asked again: the same
knobs.runtime.jit_post_compile_hook(fn=SimpleNamespace(name="_spread"), key=None)
knobs.runtime.jit_post_compile_hook(fn=SimpleNamespace(name="_spread"), key=(("i32", "D"),))
print(compiled_variants(), seen)
"""


def test_the_hook_counts_each_variant_after_the_hook_before_it() -> None:
    environ = {k: v for k, v in clean_environ().items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", HOOKED], env=environ, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    # each variant by its kernel and key, the argument's specialization that made it one
    assert done.stdout.strip() == "('_spread', \"_spread (('i32', 'D'),)\") ['_spread', '_spread']"


def test_interpreted_kernels_are_not_counted() -> None:
    done = subprocess.run([sys.executable, "-c", "from tfd_kernels.runtime import watch_compiles; "
                           "print(watch_compiles())"], env=clean_environ(TRITON_INTERPRET="1"),
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_a_variant_compiled_while_serving_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    names = ["_spread", "_whole"]
    metrics = Metrics(Lifecycle())
    metrics.watch_compiles(lambda: tuple(names), at_ready=2)
    with caplog.at_level(logging.WARNING, logger="tfd.metrics"):
        metrics.on_step(0.01, 3)
        assert not caplog.records  # nothing since READY
        names.append("_prefill_tile")
        metrics.on_step(0.01, 3)
        metrics.on_step(0.01, 3)
    (record,) = caplog.records
    assert record.getMessage() == "compiled while serving (the warm-up missed these variants): _prefill_tile"
    text = metrics.render().decode()
    assert 'tfd_kernel_variants_compiled{when="loading"} 2.0' in text
    assert 'tfd_kernel_variants_compiled{when="serving"} 1.0' in text

"""No kernel reads a module global that Triton's compiler refuses. Triton compiles a ``@triton.jit``
function's global names only when they are ``tl.constexpr`` (or functions, modules); the interpreter,
which runs this suite on CPUs, reads any global, so a kernel holding a plain ``COUNTER = 1`` passed every
CPU test and failed to compile on the H200 (2026-12-07, ``NameError: Cannot access global variable``).
The hopper compile test compiles only the kernels it lists; this scans every one."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import textwrap
from types import ModuleType

import triton
import triton.language as tl
from triton.runtime.jit import KernelInterface

import tfd_kernels

PLAIN = 3  # a global a kernel must not read
CONSTANT = tl.constexpr(3)


@triton.jit
def _reads_a_plain_global(out):
    tl.store(out, PLAIN)


@triton.jit
def _reads_a_constexpr(out):
    tl.store(out, CONSTANT)


def plain_globals(module: ModuleType) -> list[str]:
    """``module``'s jit functions' names read from plain int, float or str globals, as
    ``function: name``."""
    found = []
    for name, value in vars(module).items():
        fn = getattr(value, "fn", None)
        # a jit function (interpreted, as here, or compiled), defined in this module
        if not isinstance(value, KernelInterface) or getattr(fn, "__module__", None) != module.__name__:
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        local = {node.arg for node in ast.walk(tree) if isinstance(node, ast.arg)}
        local |= {node.id for node in ast.walk(tree)
                  if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in local:
                value_read = fn.__globals__.get(node.id)
                if isinstance(value_read, int | float | str) and not isinstance(value_read, bool):
                    found.append(f"{name}: {node.id}")
    return found


def test_the_scan_finds_a_plain_global_and_passes_a_constexpr() -> None:
    import sys

    assert plain_globals(sys.modules[__name__]) == ["_reads_a_plain_global: PLAIN"]


def test_no_kernel_reads_a_plain_global() -> None:
    modules = [importlib.import_module(f"tfd_kernels.{info.name}")
               for info in pkgutil.iter_modules(tfd_kernels.__path__)]
    scanned = [module for module in modules
               if any(isinstance(value, KernelInterface) for value in vars(module).values())]
    assert len(scanned) > 20  # the kernels' modules, found
    found = {module.__name__: plain_globals(module) for module in scanned}
    assert not {name: names for name, names in found.items() if names}

"""The ``tfd`` command in a process forked from a server that has imported what it imports, for
``support``'s daemons and heavy runs: a fresh interpreter's imports (torch, the kernels, the server's
stack) cost about 2.5 s of CPU a process and its teardown another half second, most of a short test's
time and more than a fifth of the suite's, which starts some hundred daemons. Each is still a process
of its own: its pid, its signals, its sockets, its output and its exit status, ``tfd.cli.main`` run as
``python -m tfd`` runs it, with the test's environment as its whole environment.

Imported in processes of ``support.FORKED``, whose server has preloaded these imports. What a fresh
``python -m tfd`` would set up differently is set up in ``main``: the environment (replaced whole,
then ``tfd``'s own import-time default put back, as ``import tfd`` sets it in a fresh process), the
working directory, ``sys.argv`` and the standard output and error.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import tfd
import tfd.cli

MAIN = Path(tfd.__file__).with_name("__main__.py")


def main(argv: Sequence[str], environ: Mapping[str, str], cwd: str, stdout: str, stderr: str) -> None:
    """Run ``tfd ARGV`` here (a forked process) with ``environ`` as the whole environment, from ``cwd``,
    its standard output and error appended to the files ``stdout`` and ``stderr`` (one file: both);
    its exit status is main's."""
    for fd, path in ((1, stdout), (2, stderr)):
        with open(path, "ab") as file:
            os.dup2(file.fileno(), fd)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")  # as tfd/__init__.py sets it when first imported
    sys.argv = [str(MAIN), *argv]
    tfd.cli.main(list(argv))

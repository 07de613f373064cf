"""tfd installed beside transformers and Hugging Face's `kernels`: each imports its own modules.

The test extras bring transformers (>= 5.25 depends on Hugging Face's `kernels` and imports it), so
this environment is the one a user has: tfd's kernels must import as `tfd_kernels`, a bare `kernels`
must stay Hugging Face's from any directory (the checkout's root too), and the console script must
serve from a directory outside the checkout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest

from support import ROOT, ServedDaemon, clean_environ

BIN = Path(sys.executable).parent


def python(code: str, cwd: Path, **env: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=clean_environ(**env),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("where", ["root", "elsewhere"])
def test_a_bare_kernels_is_hugging_faces_and_tfds_are_its_own(where: str, tmp_path: Path) -> None:
    cwd = ROOT if where == "root" else tmp_path
    found = json.loads(python(
        "import json, transformers.integrations.hub_kernels, kernels, tfd_kernels.gemm\n"
        "print(json.dumps([kernels.__file__, tfd_kernels.gemm.__file__]))", cwd))
    hugging_face, ours = found
    assert Path(hugging_face).parent.name == "kernels" and "site-packages" in hugging_face
    assert Path(ours) == ROOT / "kernels" / "gemm.py"  # the editable install maps the name to the folder


def test_the_console_script_serves_from_outside_the_checkout(short_tmp: Path, tmp_path: Path) -> None:
    console = BIN / "tfd"
    assert console.is_file(), f"no console script at {console}: tfd is not installed in this venv"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    daemon = ServedDaemon(short_tmp)
    try:
        daemon.start(timeout=300, command=[str(console)], cwd=elsewhere)
        reply = httpx.post(daemon.url() + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "temperature": 0})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert body["usage"]["completion_tokens"] == 4
    finally:
        daemon.close()
    assert daemon.wait() == 0, daemon.log()


def test_the_wheel_ships_every_module_under_tfds_names(tmp_path: Path) -> None:
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path),
                            str(ROOT)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("tfd-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {str(p.relative_to(ROOT)) for p in (ROOT / "tfd").rglob("*") if p.is_file()
                and "__pycache__" not in p.parts}
    expected |= {f"tfd_kernels/{p.name}" for p in (ROOT / "kernels").glob("*.py")}
    expected |= {f"tfd/_env/{p.name}" for p in (ROOT / "env").iterdir()}
    assert expected <= names, sorted(expected - names)
    assert not {name for name in names if name.split("/")[0] not in ("tfd", "tfd_kernels")
                and ".dist-info/" not in name}
    # Installed from the wheel alone, it reads its table, its demo and its sources where it lies.
    target = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                                str(target), str(wheel)], capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr
    found = json.loads(python(
        "import json, tfd, tfd_kernels.gemm\n"
        "from tfd.env import Table, table_directory\n"
        "from tfd.store.identity import sources_digest\n"
        "print(json.dumps([tfd.__file__, tfd_kernels.gemm.__file__, str(table_directory()),"
        " len(Table.load().rows), sources_digest()]))", tmp_path, PYTHONPATH=str(target)))
    for path in found[:3]:
        assert Path(path).is_relative_to(target), path
    assert found[3] > 30
    checkout = python("from tfd.store.identity import sources_digest; print(sources_digest())", tmp_path)
    assert found[4] == checkout.strip()  # the same sources, whichever way they are installed

"""The `tfd` command as a user runs it: refusals, exit status, env output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support import clean_environ, run_tfd

REFUSED = 2
DEMO_CONFIG = {"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_text"}}


def run_tfd_python(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=30)


def serve_refused(**env: str) -> str:
    """Run `tfd serve` with ``env``; assert it is refused (before anything loads: the import test
    below shows that), return its stderr."""
    done = run_tfd("serve", env=clean_environ(**env))
    assert done.returncode == REFUSED, done.stderr
    assert "Traceback" not in done.stderr
    return done.stderr


def test_bad_flash_next_switch_is_refused_by_name() -> None:
    stderr = serve_refused(TF_FLASHNEXT_STATE_PAGES="2", TF_DEMO="flashnext")
    assert "TF_FLASHNEXT_STATE_PAGES=2: must be exactly 0 or 1" in stderr


def test_another_familys_malformed_row_is_refused_with_the_rest(tmp_path: Path) -> None:
    # No model: the Qwen3.5 demo loads, and Flash Next's malformed switch is still named.
    stderr = serve_refused(TF_FLASHNEXT_STATE_PAGES="2", TF_PORT="http")
    assert stderr.startswith("tfd: configuration refused (2 problems):\n")
    assert "TF_FLASHNEXT_STATE_PAGES=2: must be exactly 0 or 1" in stderr
    assert "TF_PORT=http: must be an integer from 0 to 65535" in stderr
    # A Qwen3.5 checkpoint (its config.json is all a refusal reads).
    (tmp_path / "config.json").write_text(json.dumps(DEMO_CONFIG))
    stderr = serve_refused(TF_FLASHNEXT_STATE_PAGES="2", TF_MODEL=str(tmp_path))
    assert stderr == "tfd: configuration refused:\n  TF_FLASHNEXT_STATE_PAGES=2: must be exactly 0 or 1\n"


def test_bad_port_is_refused_by_name() -> None:
    stderr = serve_refused(TF_PORT="http")
    assert "TF_PORT=http: must be an integer from 0 to 65535" in stderr


def test_misspelt_name_is_refused_naming_the_right_one() -> None:
    stderr = serve_refused(TF_PROT="8000")
    assert "TF_PROT: unknown setting; did you mean TF_PORT?" in stderr


def test_two_bad_values_are_named_in_one_message() -> None:
    stderr = serve_refused(TF_PORT="http", TF_FLASHNEXT_STATE_PAGES="2", TF_DEMO="flashnext")
    assert stderr.startswith("tfd: configuration refused (2 problems):\n")
    assert "TF_PORT=http" in stderr
    assert "TF_FLASHNEXT_STATE_PAGES=2" in stderr


def test_a_refusal_comes_before_torch_or_the_server_is_imported() -> None:
    done = run_tfd_python("-X", "importtime", "-m", "tfd", "serve",
                          env=clean_environ(TF_PORT="http"))
    assert done.returncode == REFUSED
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "tfd.env" in imported
    assert not {"torch", "trio", "hypercorn", "tfd.server.daemon"} & imported


def test_bad_flag_value_is_refused_naming_flag_and_row() -> None:
    done = run_tfd("serve", "--drain-timeout-s", "later")
    assert done.returncode == REFUSED
    assert "--drain-timeout-s later (TF_DRAIN_TIMEOUT_S): must be a number from 0 to 3600" in done.stderr


def test_unknown_flag_exits_2() -> None:
    done = run_tfd("serve", "--prot", "8000")
    assert done.returncode == REFUSED
    assert "--prot" in done.stderr


@pytest.mark.parametrize("text", ["\t", "\x1b[2J", "é", "9" * 1000, "1\n2", "\udcff", " "])
def test_odd_values_are_accepted_or_refused_by_name(text: str) -> None:
    for name in ("TF_PORT", "TF_HOST", "TF_API_KEYS", "TF_ADMIN_SOCKET", "TF_FLASHNEXT_STATE_PAGES"):
        done = run_tfd("env", "--check", env=clean_environ(**{name: text}))
        assert "Traceback" not in done.stderr
        if done.returncode != 0:
            assert done.returncode == REFUSED, done.stderr
            assert f"{name}=" in done.stderr
    # None of these is a port.
    assert run_tfd("env", "--check", env=clean_environ(TF_PORT=text)).returncode == REFUSED


def test_env_check_accepts_a_good_environment() -> None:
    done = run_tfd("env", "--check", env=clean_environ(TF_PORT="9000", TF_CLI_CONFIG_FILE="/x"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("tfd env: 42 settings ok, 2 set in the environment")


def test_env_prints_the_table_with_current_values_and_masks_secrets() -> None:
    done = run_tfd("env", env=clean_environ(TF_PORT="9000", TF_API_KEYS="sk-secret"))
    assert done.returncode == 0
    assert "default 8000; now 9000" in done.stdout
    assert "sk-secret" not in done.stdout
    assert "TF_FLASHNEXT_STATE_PAGES" in done.stdout


def test_version_and_module_entry_point() -> None:
    done = run_tfd("--version")
    assert done.returncode == 0
    assert done.stdout.startswith("tfd 0.")

"""env/tfd.service agrees with what the daemon does."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tfd.env import SettingsRefused, Table
from tfd.server.daemon import HTTP_GRACE_S

UNIT = Path(__file__).resolve().parent.parent / "env" / "tfd.service"


class Section(dict[str, str]):
    """A unit section: the last value of each key (as systemd reads most), all values kept."""

    def __init__(self) -> None:
        super().__init__()
        self.every: dict[str, list[str]] = {}


def service() -> Section:
    sections: dict[str, Section] = {}
    current = None
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), Section())
            continue
        assert current is not None, line
        key, value = line.split("=", 1)
        current[key] = value
        current.every.setdefault(key, []).append(value)
    return sections["Service"]


def seconds(value: str) -> float:
    units = {"s": 1, "min": 60}
    for unit, scale in sorted(units.items(), key=lambda item: -len(item[0])):
        if value.endswith(unit):
            return float(value[: -len(unit)]) * scale
    return float(value)


def test_the_unit_waits_for_ready_and_watches_the_watchdog() -> None:
    unit = service()
    assert unit["Type"] == "notify"
    assert unit["NotifyAccess"] == "main"
    assert seconds(unit["WatchdogSec"]) > 0
    assert unit["ExecStart"].endswith("tfd serve")


def test_the_unit_reads_the_shipped_environment_file() -> None:
    assert service()["EnvironmentFile"].lstrip("-").endswith("/tfd.env")
    assert "PYTHONUNBUFFERED=1" in service().every["Environment"]


def test_the_admin_socket_default_lives_in_the_runtime_directory() -> None:
    from tfd.server.admin import SERVICE_SOCKET, socket_path

    unit = service()
    runtime = f"/run/{unit['RuntimeDirectory']}"
    path, private = socket_path(None, {"RUNTIME_DIRECTORY": runtime})
    assert str(path) == SERVICE_SOCKET
    assert not private
    assert unit["StateDirectory"] == "tfd"


def test_stop_timeout_outlasts_the_default_drain() -> None:
    drain = Table.load().read({}).value("TF_DRAIN_TIMEOUT_S", float)
    assert seconds(service()["TimeoutStopSec"]) > drain + HTTP_GRACE_S


def test_a_refused_configuration_is_not_restarted() -> None:
    statuses = service()["RestartPreventExitStatus"].split()
    assert str(SettingsRefused.EXIT_STATUS) in statuses


def test_a_cuda_device_that_is_absent_is_refused_by_name() -> None:
    import torch

    from tfd.env import SettingsRefused
    from tfd.server.service import pick_device

    if torch.cuda.is_available():
        assert pick_device("cuda").type == "cuda"
        return
    assert pick_device("auto").type == "cpu"
    with pytest.raises(SettingsRefused, match="TF_DEVICE=cuda"):
        pick_device("cuda")


# What env/tfd.service must keep: the sandbox a GPU daemon allows (the unit's comments say why each).
HARDENING = {
    "NoNewPrivileges": "yes", "CapabilityBoundingSet": "", "UMask": "0077", "ProtectSystem": "strict",
    "ProtectHome": "yes", "PrivateTmp": "yes", "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes", "ProtectKernelLogs": "yes", "ProtectControlGroups": "yes",
    "ProtectClock": "yes", "ProtectHostname": "yes", "ProtectProc": "invisible", "LockPersonality": "yes",
    "RestrictRealtime": "yes", "RestrictNamespaces": "yes", "RestrictSUIDSGID": "yes", "RemoveIPC": "yes",
    "SystemCallArchitectures": "native",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6", "DevicePolicy": "closed",
    "SystemCallErrorNumber": "EPERM", "MemoryDenyWriteExecute": "yes", "PrivateUsers": "yes",
}


def test_the_unit_is_hardened_as_far_as_a_gpu_allows() -> None:
    unit = service()
    assert {key: unit.get(key) for key in HARDENING} == HARDENING
    assert unit.every["SystemCallFilter"] == ["@system-service", "~@privileged"]
    # CUDA's nodes, and nothing else but what DevicePolicy=closed keeps
    assert sorted(unit.every["DeviceAllow"]) == ["char-nvidia-caps r", "char-nvidia-frontend rw",
                                                 "char-nvidia-uvm rw"]
    assert unit["PrivateDevices"] == "no"  # it would hide /dev/nvidia*
    # Triton's and the driver's JIT caches live where the service may write
    assert {"TRITON_CACHE_DIR=%C/tfd/triton", "CUDA_CACHE_PATH=%C/tfd/nv"} <= set(unit.every["Environment"])
    assert unit["CacheDirectory"] == "tfd"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_analyze_scores_the_unit_5_or_better() -> None:
    done = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--threshold=50", "--no-pager",
                           str(UNIT)], capture_output=True, text=True, timeout=60)
    found = re.search(r"Overall exposure level for tfd\.service: (\d+\.\d)", done.stdout)
    assert found, done.stdout + done.stderr
    assert done.returncode == 0 and float(found[1]) <= 5.0, done.stdout
    # the score the unit's header states is the one this systemd-analyze gives, where it is that version
    version = subprocess.run(["systemd-analyze", "--version"], capture_output=True,
                             text=True).stdout.split()[1]
    stated = re.search(r"scores it (\d+\.\d) \w+ \(systemd (\d+)\)", UNIT.read_text())
    assert stated, "the unit's header states its score and the systemd that gave it"
    if stated[2] == version:
        assert stated[1] == found[1]


def test_the_readme_installs_the_environment_file_for_root_and_the_service_group_alone() -> None:
    readme = (UNIT.parent.parent / "README.md").read_text()
    install = next(line for line in readme.splitlines() if "/etc/tfd/tfd.env" in line and "install" in line)
    assert "-m 0640 -o root -g tfd " in install, install
    assert service()["EnvironmentFile"].lstrip("-") == "/etc/tfd/tfd.env"

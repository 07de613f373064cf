"""env/tfd.service agrees with what the daemon does."""

from __future__ import annotations

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

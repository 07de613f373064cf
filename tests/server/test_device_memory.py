"""TF_STEP_TOKENS=auto: the rows of a step by the device, on both sides of the large-device line; a
CPU pool against the host's available memory, on both sides of what fits."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfd.bench.defaults import STEP_TOKENS
from tfd.env import SettingsRefused
from tfd.server.device_memory import (
    CPU_STEP_TOKENS,
    GPU_STEP_TOKENS,
    HOST_RESERVE_BYTES,
    LARGE_DEVICE_GIB,
    LARGE_STEP_TOKENS,
    auto_step_tokens,
    check_host_pool,
    host_available,
)

GIB = 2**30


def test_a_large_device_steps_32768_rows_a_smaller_2048_the_cpu_256() -> None:
    line = LARGE_DEVICE_GIB * GIB
    assert auto_step_tokens(None) == CPU_STEP_TOKENS == 256
    assert auto_step_tokens(line - 1) == GPU_STEP_TOKENS == 2048
    assert auto_step_tokens(line) == LARGE_STEP_TOKENS == 32768
    assert auto_step_tokens(int(139.8 * GIB)) == 32768  # an H200
    assert auto_step_tokens(24 * GIB) == 2048
    assert STEP_TOKENS == LARGE_STEP_TOKENS  # the engine bench steps as the daemon on a large GPU


def test_a_memory_limit_below_the_line_steps_as_a_smaller_device() -> None:
    h200, line = int(139.8 * GIB), LARGE_DEVICE_GIB * GIB
    assert auto_step_tokens(h200, 40 * GIB) == 2048  # TF_CUDA_MEMORY_LIMIT_GB=40
    assert auto_step_tokens(h200, line - 1) == 2048
    assert auto_step_tokens(h200, line) == 32768
    assert auto_step_tokens(24 * GIB, 100 * GIB) == 2048  # a limit above the device is the device


def test_a_cpu_pool_fits_up_to_the_available_memory_less_the_reserve() -> None:
    available = 8 * GIB
    check_host_pool(available - HOST_RESERVE_BYTES, "TF_POOL_GIB=7.5", available)  # exactly fits
    with pytest.raises(SettingsRefused) as refused:
        check_host_pool(available - HOST_RESERVE_BYTES + 1, "TF_POOL_GIB=7.6", available)
    assert str(refused.value).splitlines()[1].strip() == (
        "TF_POOL_GIB=7.6: the host has 8.00 GiB available; TF_POOL_GIB=7.5 or less fits beside a reserve "
        "of 0.5 GiB")
    check_host_pool(16384 * GIB, "TF_POOL_GIB=16384", None)  # the host's memory unknown: the allocator says


def test_a_host_with_less_than_the_reserve_and_the_least_pool_fits_none() -> None:
    least = HOST_RESERVE_BYTES + GIB // 1000 + 1  # the row's least value, 0.001 GiB, beside the reserve
    with pytest.raises(SettingsRefused, match=r"TF_POOL_GIB=1 or less fits"):
        check_host_pool(2 * GIB, "TF_POOL_GIB=2", GIB + HOST_RESERVE_BYTES)
    with pytest.raises(SettingsRefused, match=r"TF_POOL_GIB=0\.001 or less fits"):
        check_host_pool(GIB, "TF_POOL_GIB=1", least)
    with pytest.raises(SettingsRefused, match=r"TF_POOL_GIB's CPU default 0\.25: the host has 0\.50 GiB "
                                              r"available; no pool fits"):
        check_host_pool(GIB // 4, "TF_POOL_GIB's CPU default 0.25", least - 2)


def test_the_hosts_memory_is_meminfos_available_or_the_cgroups_room_when_less(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:   16000000 kB\nSwapTotal: 0 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    assert host_available(meminfo, cgroup) == 16000000 * 1024  # no cgroup files: the host's
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text(f"{GIB}\n")
    assert host_available(meminfo, cgroup) == 16000000 * 1024  # no limit
    (cgroup / "memory.max").write_text(f"{4 * GIB}\n")  # systemd's MemoryMax=4G, a GiB in use
    assert host_available(meminfo, cgroup) == 3 * GIB
    (cgroup / "memory.max").write_text(f"{32 * GIB}\n")  # a limit above the host's: the host's
    assert host_available(meminfo, cgroup) == 16000000 * 1024
    meminfo.write_text("MemTotal: 1 kB\n")
    assert host_available(meminfo, cgroup) is None
    assert host_available(tmp_path / "missing", cgroup) is None

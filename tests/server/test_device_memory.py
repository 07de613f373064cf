"""TF_STEP_TOKENS=auto: the rows of a step by the device, on both sides of the large-device line."""

from __future__ import annotations

from tfd.server.device_memory import (
    CPU_STEP_TOKENS,
    GPU_STEP_TOKENS,
    LARGE_DEVICE_GIB,
    LARGE_STEP_TOKENS,
    auto_step_tokens,
)

GIB = 2**30


def test_a_large_device_steps_8192_rows_a_smaller_2048_the_cpu_256() -> None:
    line = LARGE_DEVICE_GIB * GIB
    assert auto_step_tokens(None) == CPU_STEP_TOKENS == 256
    assert auto_step_tokens(line - 1) == GPU_STEP_TOKENS == 2048
    assert auto_step_tokens(line) == LARGE_STEP_TOKENS == 8192
    assert auto_step_tokens(int(139.8 * GIB)) == 8192  # an H200
    assert auto_step_tokens(24 * GIB) == 2048


def test_a_memory_limit_below_the_line_steps_as_a_smaller_device() -> None:
    h200, line = int(139.8 * GIB), LARGE_DEVICE_GIB * GIB
    assert auto_step_tokens(h200, 40 * GIB) == 2048  # TF_CUDA_MEMORY_LIMIT_GB=40
    assert auto_step_tokens(h200, line - 1) == 2048
    assert auto_step_tokens(h200, line) == 8192
    assert auto_step_tokens(24 * GIB, 100 * GIB) == 2048  # a limit above the device is the device

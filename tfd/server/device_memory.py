"""The measured side of a GPU's plan (``tfd.pool.device_plan``): free memory, weights, a step.

``measure_step`` runs one prefill of ``TF_STEP_TOKENS`` rows through a pool of one lane, made for it
and freed after, and takes the peak of what it allocated: the activations a serving step needs
beside the pool. It also compiles that step's prefill kernels before the pool exists.

Resource handling: the one-lane pool's lease is finished on every path; the pool and the step's
tensors go with ``measure_step``'s frame, and ``plan_device`` then gives their memory back to the
device (torch's cache emptied) before it reads what is free.
"""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import torch

from tfd.env import SettingsRefused
from tfd.families.hybrid import HybridModel
from tfd.model.memory import LaneMemory, PageRows, Span
from tfd.pool.device_plan import GIB, DevicePlan, graph_bytes, planned_bytes, reserve_bytes
from tfd.pool.layout import Layout
from tfd.pool.pages import Pool

log = logging.getLogger("tfd.memory")
# TF_STEP_TOKENS=auto: on a device of LARGE_DEVICE_GIB or more, 32,768 rows (through HTTP on the H200's
# 9B shape a burst of 32 1,024-token prompts in one step: a stream's time a token 1.05x the decode step,
# 1.24-1.31x at 8,192; docs/bench.md); below it 2,048, whose activations take a sixteenth; the CPU 256
LARGE_DEVICE_GIB = 70
LARGE_STEP_TOKENS, GPU_STEP_TOKENS, CPU_STEP_TOKENS = 32768, 2048, 256
# Beside a pool on the CPU: what a step's activations, Python and torch grow into.
HOST_RESERVE_BYTES = 1 << 29


def auto_step_tokens(total_bytes: int | None, limit_bytes: int | None = None) -> int:
    """TF_STEP_TOKENS=auto for a device of ``total_bytes`` (None: the CPU) of which tfd may use
    ``limit_bytes`` (TF_CUDA_MEMORY_LIMIT_GB; None: all of it)."""
    if total_bytes is None:
        return CPU_STEP_TOKENS
    usable = total_bytes if limit_bytes is None else min(total_bytes, limit_bytes)
    return LARGE_STEP_TOKENS if usable >= LARGE_DEVICE_GIB * 2**30 else GPU_STEP_TOKENS


def device_bytes(device: torch.device) -> int | None:
    """The memory ``device`` has in all; None off a GPU."""
    return torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None


def free_at_load(device: torch.device) -> int | None:
    """The bytes free on ``device`` now (its CUDA context made); None off a GPU."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


def host_available(meminfo: Path = Path("/proc/meminfo"),
                   cgroup: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes the host can give this process without swapping: Linux's MemAvailable, less where the
    process's cgroup (systemd's MemoryMax=, a container's limit) allows less; None where unknown."""
    try:
        fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            available = min(available, int(limit) - int((cgroup / "memory.current").read_text()))
    except (OSError, ValueError):
        pass  # no cgroup v2 limit to read
    return max(0, available)


def check_host_pool(pool_bytes: int, source: str, available: int | None) -> None:
    """Refuse, naming ``source`` (the row and value that asked for it), a CPU pool of ``pool_bytes``
    more than the host has ``available`` beside HOST_RESERVE_BYTES; the refusal says what fits."""
    if available is None or pool_bytes + HOST_RESERVE_BYTES <= available:
        return
    most = int((available - HOST_RESERVE_BYTES) / GIB * 1000) / 1000  # TF_POOL_GIB's least step is 0.001
    fits = f"TF_POOL_GIB={most:g} or less fits" if most >= 0.001 else "no pool fits"
    raise SettingsRefused([f"{source}: the host has {available / GIB:.2f} GiB available; {fits} beside a "
                           f"reserve of {HOST_RESERVE_BYTES / GIB:g} GiB"])


def measure_step(model: HybridModel, layout: Layout, step_tokens: int, device: torch.device) -> int:
    """Peak bytes one prefill of ``step_tokens`` rows allocates beyond what stood before it (its
    last row's logits included), in a pool of one lane of ``layout``."""
    pool = Pool(layout, layout.need(step_tokens), device=device)
    lease = pool.promise(step_tokens)
    try:
        lease.take_state(init=model.nonzero_state)
        lease.take(step_tokens)
        lane = LaneMemory(lease.pieces, lease.page_table, lease.host_table)
        ids = torch.arange(step_tokens, device=device) % model.cfg.vocab
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        with torch.no_grad():
            output = model.forward([Span(lane, 0, ids)], PageRows(pool))
            model.logits(output.hidden[-1:])
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - before)
    finally:
        lease.finish()


def plan_device(model: HybridModel, layout: Layout, device: torch.device, *, free: int, limit: int | None,
                weights: int, step_tokens: int, lanes: int, window: int, graphs: bool) -> DevicePlan:
    """The device's plan: ``weights`` bytes loaded, a ``step_tokens``-row step measured now, graphs
    (when ``graphs``) for up to ``lanes`` lanes, verify windows of ``window`` rows (0: none)."""
    activations = measure_step(model, layout, step_tokens, device)
    graph = graph_bytes(activations, step_tokens, lanes, window, model.cfg.vocab) if graphs else 0
    gc.collect()  # the measured step's tensors are gone with its frame: give their memory back
    torch.cuda.empty_cache()
    free_now, _ = torch.cuda.mem_get_info(device)
    held = torch.cuda.memory_reserved(device)
    runtime = max(0, free - free_now - held)  # beside torch's allocator
    planned = planned_bytes(free, limit)
    plan = DevicePlan(planned, free, weights, activations, graph, reserve_bytes(planned), step_tokens,
                      runtime, free_now)
    log.info("device: %.2f GiB free once the weights are in; torch holds %.2f GiB, %.2f GiB of it in "
             "segments its tensors share (the step's activations reuse them)", free_now / 2**30, held / 2**30,
             (held - torch.cuda.memory_allocated(device)) / 2**30)
    log.info("device: %.2f GiB planned (%.2f GiB free at load%s): %s; %.2f GiB left for the pool",
             plan.planned / 2**30, free / 2**30,
             "" if limit is None else f", TF_CUDA_MEMORY_LIMIT_GB={limit / 2**30:g}", plan.where(),
             plan.pool / 2**30)
    return plan

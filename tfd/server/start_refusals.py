"""What a start refuses that depends on the model and the settings together, each problem naming
the rows at fault and the nearest values that would work (exit 2: systemd's unit does not restart).

Out of memory while loading, measuring or allocating is one of them: the rows to lower are named.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from tfd.checkpoint import read_config
from tfd.env import Settings, SettingsRefused
from tfd.env_kinds import Integer
from tfd.pool.config import CPU_POOL_BYTES, GIB, PoolConfig
from tfd.pool.device_plan import DevicePlan
from tfd.pool.layout import Layout

OUT_OF_MEMORY = ("the device ran out of memory {doing}: lower TF_POOL_GIB, TF_PARALLEL, TF_STEP_TOKENS or "
                 "TF_CONTEXT, or set TF_CUDA_MEMORY_LIMIT_GB below what the device has free")
HOST_OUT_OF_MEMORY = ("the host ran out of memory {doing}: lower TF_POOL_GIB, TF_PARALLEL, TF_STEP_TOKENS or "
                      "TF_CONTEXT")


def context_refusals(settings: Settings, layout: Layout, pool_bytes: int, source: str,
                     model: Path) -> list[str]:
    """What is wrong with TF_CONTEXT for the model at ``model`` and a pool of ``pool_bytes`` (its
    size from ``source``), each problem with the most that would do."""
    context = settings.value("TF_CONTEXT", int)
    kind = settings.table.by_name()["TF_CONTEXT"].kind
    least = kind.low if isinstance(kind, Integer) else 1
    problems = []
    positions = read_config(model).text.get("max_position_embeddings")
    if isinstance(positions, int) and context > positions:
        problems.append(f"TF_CONTEXT={context}: past the model's {positions} positions "
                        f"(max_position_embeddings in its config.json); TF_CONTEXT={positions} is the most")
    if layout.plan(context, pool_bytes) == 0:
        need = layout.lane_bytes(context) + layout.page_bytes
        most = layout.most_window(pool_bytes)
        fits = f"TF_CONTEXT={most} is the most a lane of it holds" if most >= least else "no lane fits it"
        problems.append(f"TF_CONTEXT={context}: one lane of {context} tokens needs {need / GIB:.3g} GiB; the "
                        f"pool's {pool_bytes / GIB:.3g} GiB ({source}) holds none; {fits}")
    return problems


def pool_source(config: PoolConfig, plan: DevicePlan | None) -> str:
    """Where the pool's size came from, for a refusal."""
    if config.size is not None:
        return f"TF_POOL_GIB={round(config.size / GIB, 6):g}"  # as given: 0.001, not 0.000999999
    if plan is None:
        return f"TF_POOL_GIB's CPU default {CPU_POOL_BYTES / GIB:g}"
    limit = "TF_CUDA_MEMORY_LIMIT_GB" if config.memory_limit is not None else "the device's free memory"
    return f"{limit} less {plan.where()}"


@contextlib.contextmanager
def refusing_oom(doing: str) -> Iterator[None]:
    """Out of memory while ``doing`` (a GPU's, or the CPU allocator's refusal) becomes a configuration
    refusal naming the rows to change (exit 2, not a traceback)."""
    try:
        yield
    except torch.OutOfMemoryError:
        raise SettingsRefused([OUT_OF_MEMORY.format(doing=doing)]) from None
    except RuntimeError as error:
        if "can't allocate memory" not in str(error):  # torch's CPU allocator says so, as a RuntimeError
            raise
        raise SettingsRefused([HOST_OUT_OF_MEMORY.format(doing=doing)]) from None

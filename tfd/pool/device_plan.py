"""How a GPU's memory is shared out at load: what serving needs outside the pool, and the pool.

The pool takes what is left of the memory tfd plans with (``TF_CUDA_MEMORY_LIMIT_GB``, or what the
device has free at load) once the rest is set aside: the weights (measured once loaded), the
activations of one step of ``TF_STEP_TOKENS`` rows (measured), the decode and verify graphs'
private memory (estimated from that measurement: a graph row costs what a step's row costs, plus
its own fp32 logits, since every decode row draws), and a reserve for what grows beside them (the
caching allocator's fragmentation, cuBLAS workspaces, compiled kernels' modules, the learned-state
read's device copies). Pure arithmetic, so both sides of each bound are tested on the CPU.
"""

from __future__ import annotations

import attrs

GIB = 1 << 30
# What grows beside the measured needs while serving, at least a GiB and 2% of the device.
RESERVE = GIB
RESERVE_SHARE = 0.02
# Vocabulary-wide bytes a graph row keeps: the head's logits and the draw's fp32 work over them, the
# MTP chain's own (the H200's 9B verify graphs ran out of memory with 4: docs/bench.md).
LOGIT_BYTES = 16


class DeviceTooSmall(Exception):
    """The device cannot hold the weights and what serving needs beside them; ``problems`` name
    the rows that would make room, one line each."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


@attrs.frozen
class DevicePlan:
    """Bytes of one device: ``planned`` is all tfd may use; the pool gets what the rest leaves."""

    planned: int  # TF_CUDA_MEMORY_LIMIT_GB, or the memory free at load (whichever is less)
    free_at_load: int
    weights: int
    activations: int  # one step of ``step_tokens`` rows, measured
    graphs: int  # decode and verify graphs, estimated
    reserve: int
    step_tokens: int
    runtime: int = 0  # taken beside torch's allocator since load (the driver's modules, workspaces)
    free_before_pool: int | None = None  # free once weights and the step are in (None: not read)

    @property
    def outside(self) -> int:
        """Everything but the pool."""
        return self.weights + self.activations + self.graphs + self.reserve + self.runtime

    @property
    def pool(self) -> int:
        """What the pool may take (0 when the rest does not fit): what the plan leaves, and no more than
        is free once the weights are in less what is still to come (the allocator may keep a loaded
        model's temporaries in segments that a tensor still uses: the step's activations reuse them,
        the pool cannot)."""
        left = self.planned - self.outside
        if self.free_before_pool is not None:
            left = min(left, self.free_before_pool - self.activations - self.graphs - self.reserve)
        return max(0, left)

    def check(self, explicit_pool: int | None) -> int:
        """The pool's bytes: ``explicit_pool`` (TF_POOL_GIB) when it fits, else what is left. Raises
        ``DeviceTooSmall`` when nothing is left, or ``explicit_pool`` is more than is."""
        left = self.pool
        if explicit_pool is None and left > 0:
            return left
        if explicit_pool is not None and explicit_pool <= left:
            return explicit_pool
        asked = "nothing is left for the pool" if explicit_pool is None \
            else f"TF_POOL_GIB={round(explicit_pool / GIB, 6):g} is more than the {left / GIB:.2f} GiB left"
        raise DeviceTooSmall([f"{asked} of {self.planned / GIB:.2f} GiB planned ({self.where()}); lower "
                              "TF_POOL_GIB, TF_STEP_TOKENS or TF_PARALLEL, raise TF_CUDA_MEMORY_LIMIT_GB, "
                              "or free the device"])

    def where(self) -> str:
        """What went where, in GiB, for people."""
        return (f"weights {self.weights / GIB:.2f}, activations of a {self.step_tokens}-row step "
                f"{self.activations / GIB:.2f}, graphs {self.graphs / GIB:.2f}, runtime "
                f"{self.runtime / GIB:.2f}, reserve {self.reserve / GIB:.2f} GiB")

    def as_dict(self) -> dict[str, int]:
        return {"planned_bytes": self.planned, "free_at_load_bytes": self.free_at_load,
                "weight_bytes": self.weights, "activation_bytes": self.activations,
                "graph_bytes": self.graphs, "reserve_bytes": self.reserve, "runtime_bytes": self.runtime,
                "step_tokens": self.step_tokens, "free_before_pool_bytes": self.free_before_pool or 0,
                "pool_bytes": self.pool}


def planned_bytes(free_at_load: int, limit: int | None) -> int:
    """What tfd plans with: the memory free at load, or ``limit`` (TF_CUDA_MEMORY_LIMIT_GB) when
    that is less."""
    return free_at_load if limit is None else min(limit, free_at_load)


def reserve_bytes(planned: int) -> int:
    """The reserve of a device planned at ``planned`` bytes."""
    return max(RESERVE, int(planned * RESERVE_SHARE))


def graph_bytes(activations: int, step_tokens: int, lanes: int, window: int, vocab: int) -> int:
    """The graphs' private memory for up to ``lanes`` lanes: a decode row a lane and, drafting,
    ``window`` verify rows a lane (``window`` 0: no verify graphs), each row costing what a row of
    the measured step did plus its fp32 logits."""
    rows = lanes * (1 + window)
    return rows * (-(-activations // step_tokens) + vocab * LOGIT_BYTES)


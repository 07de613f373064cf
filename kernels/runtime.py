"""What every kernel of ``tfd_kernels`` shares: whether Triton interprets, and device counters.

``tfd_kernels`` is this folder (``kernels/`` of the checkout) under a name tfd owns: Triton kernels
for the device path, each module with a launcher and a torch reference. The folder has no
``__init__``, so from the checkout's root a bare ``import kernels`` still finds Hugging Face's package.

``watch_compiles``: every kernel variant Triton compiles (or reads back from its cache) from then on
is counted by name, so the daemon can tell a warm-up that missed a variant from one that did not.

``INTERPRETED``: the kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1``, how CI tests
them). Its ``tl.dot`` on bf16 operands gives garbage, so kernels pass this as a constexpr and widen
such operands to fp32 there first (exact: a bf16 product fits an fp32 mantissa).
"""

import os
from typing import Any

import torch

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

_COUNTERS: dict[tuple[str, torch.device], torch.Tensor] = {}


def counters(name: str, size: int, device: torch.device) -> torch.Tensor:
    """The device's int32 counters called ``name``, ``size`` of them: zero between launches (the
    kernels that count on them rearm them), allocated once so CUDA graphs capture fixed addresses."""
    found = _COUNTERS.get((name, device))
    if found is None:
        found = _COUNTERS[(name, device)] = torch.zeros(size, dtype=torch.int32, device=device)
    return found


_VARIANTS: list[str] = []  # appended by the engine thread, read whole by others (atomic in CPython)
_WATCHING: list[bool] = []


def watch_compiles() -> bool:
    """Count each Triton kernel variant compiled from now on (``compiled_variants``), through Triton's
    post-compile hook, after any hook already set there. False where kernels are interpreted or this
    Triton has no such hook (nothing is counted then)."""
    if _WATCHING:
        return _WATCHING[0]
    try:
        from triton import knobs

        before = knobs.runtime.jit_post_compile_hook
    except (ImportError, AttributeError):
        _WATCHING.append(False)
        return False

    def counted(**info: Any) -> bool | None:
        # the kernel and its key, each argument's specialization: what made it a new variant (Triton's
        # own repr of it is empty in 3.6)
        key = info.get("key")
        _VARIANTS.append(getattr(info.get("fn"), "name", "?") + ("" if key is None else f" {key}"))
        return before(**info) if before is not None else None

    knobs.runtime.jit_post_compile_hook = counted
    _WATCHING.append(not INTERPRETED)
    return not INTERPRETED


def compiled_variants() -> tuple[str, ...]:
    """Each variant compiled since ``watch_compiles``, in order: its kernel's name, then (where Triton
    gives it) a space and its key, each argument's type and specialization."""
    return tuple(_VARIANTS)

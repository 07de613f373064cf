"""What every kernel of ``tfd_kernels`` shares: whether Triton interprets, and device counters.

``tfd_kernels`` is this folder (``kernels/`` of the checkout) under a name tfd owns: Triton kernels
for the device path, each module with a launcher and a torch reference. The folder has no
``__init__``, so from the checkout's root a bare ``import kernels`` still finds Hugging Face's package.

``INTERPRETED``: the kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1``, how CI tests
them). Its ``tl.dot`` on bf16 operands gives garbage, so kernels pass this as a constexpr and widen
such operands to fp32 there first (exact: a bf16 product fits an fp32 mantissa).
"""

import os

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

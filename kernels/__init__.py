"""Triton kernels for tfd's device path; each module has a launcher and a torch reference.

``INTERPRETED``: the kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1``, how CI tests
them). Its ``tl.dot`` on bf16 operands gives garbage, so kernels pass this as a constexpr and widen
such operands to fp32 there first (exact: a bf16 product fits an fp32 mantissa).
"""

import os

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

"""What the GDN kernel tests share: head shapes, the pool's piece alignment, fp32 tolerances."""

from __future__ import annotations

import attrs

ALIGN = 256  # the pool places pieces at multiples of this many bytes
TOL = {"rtol": 1e-5, "atol": 1e-5}  # fp32 math on both sides, whatever the input dtype


@attrs.frozen
class Dims:
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int

    @property
    def state(self) -> int:
        return self.value_heads * self.key_dim * self.value_dim

    @property
    def log_row(self) -> int:

        return self.key_heads * self.key_dim + self.value_heads * self.value_dim + 2 * self.value_heads

    @property
    def scale(self) -> float:
        return float(self.key_dim ** -0.5)

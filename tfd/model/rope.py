"""Partial rotary position embedding, rotate-half style, on the first ``dim`` lanes of a head.

Qwen3.5 and Flash Next use interleaved M-RoPE; for text its three position rows are equal, so the
angles reduce to ordinary RoPE of the 1-D position (reference/model.md 2.3).
"""

from __future__ import annotations

import attrs
import torch


@attrs.frozen
class Rotary:
    """``inv_freq`` has ``dim / 2`` entries: theta ** (-2i / dim)."""

    inv_freq: torch.Tensor

    @classmethod
    def of(cls, head_dim: int, partial: float, theta: float, device: torch.device | str = "cpu") -> Rotary:
        dim = int(head_dim * partial)
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))
        return cls(inv_freq)

    @property
    def dim(self) -> int:
        return 2 * self.inv_freq.shape[0]

    def angles(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each [rows, dim], for integer ``positions`` [rows]."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        freqs = torch.cat((freqs, freqs), dim=-1)
        return freqs.cos().to(dtype), freqs.sin().to(dtype)

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` [rows, heads, head_dim] by per-row angles [rows, dim]."""
        cos, sin = cos[:, None, :], sin[:, None, :]
        rotated, passed = x[..., :self.dim], x[..., self.dim:]
        half = self.dim // 2
        turned = torch.cat((-rotated[..., half:], rotated[..., :half]), dim=-1)
        return torch.cat((rotated * cos + turned * sin, passed), dim=-1)

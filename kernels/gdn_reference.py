"""Gated DeltaNet decode in torch: ``tfd_kernels.gdn_decode``'s ``decode``, ``verify`` and ``replay``
a lane at a time, the kernels' reference on the CPU and in their tests.

Every row's update is ``_reference_step`` (S <- e^g S; S <- S + k (beta (v - S^T k))^T, fp32), with k
and q normalised as ``tfd.model.gdn`` prepares them.
"""

from __future__ import annotations

import torch


def _reference_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                    s: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One lane's rows as tfd.model.gdn prepares and runs them: (outputs, normalised k, final state)."""
    ratio = v.shape[1] // q.shape[1]

    def l2norm(x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)

    key = l2norm(k)
    q_rep, k_rep = l2norm(q).repeat_interleave(ratio, dim=1) * scale, key.repeat_interleave(ratio, dim=1)
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for row in range(q.shape[0]):
        s = _reference_step(s, k_rep[row], v[row].float(), g[row], beta[row])
        out[row] = (s * q_rep[row][:, :, None]).sum(dim=1)
    return out, key, s


def _reference_step(s: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
                    ) -> torch.Tensor:
    """One row's update of a state [value_heads, key_dim, value_dim] in torch (k per value head, fp32):
    S <- e^g S; S <- S + k (beta (v - S^T k))^T. Decode, verify and replay's references all use it."""
    s = s * torch.exp(g)[:, None, None]
    read = (s * k[:, :, None]).sum(dim=1)
    delta = beta[:, None] * (v - read)
    return s + k[:, :, None] * delta[:, None, :]


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              states: torch.Tensor, state_at: torch.Tensor, scale: float) -> torch.Tensor:
    """``decode`` in torch, a lane at a time."""
    out = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    size = v.shape[1] * q.shape[2] * v.shape[2]
    for lane, at in enumerate(state_at.tolist()):
        if at >= 0:
            state = states[at:at + size].view(v.shape[1], q.shape[2], v.shape[2])
            rows, _, after = _reference_rows(q[lane, None], k[lane, None], v[lane, None], g[lane, None],
                                             beta[lane, None], state, scale)
            out[lane] = rows[0]
            state.copy_(after)
    return out


def reference_verify(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     states: torch.Tensor, state_at: torch.Tensor, spare_at: torch.Tensor, log: torch.Tensor,
                     log_at: torch.Tensor, scale: float) -> torch.Tensor:
    """``verify`` in torch, a lane at a time."""
    rows, value_heads, value_dim = v.shape[1:]
    out = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    size = value_heads * q.shape[3] * value_dim
    for lane, (at, spare, entry) in enumerate(zip(state_at.tolist(), spare_at.tolist(), log_at.tolist(),
                                                  strict=True)):
        if at >= 0:
            state = states[at:at + size].view(value_heads, q.shape[3], value_dim)
            out[lane], key, after = _reference_rows(q[lane], k[lane], v[lane], g[lane], beta[lane], state,
                                                    scale)
            states[spare:spare + size].copy_(after.flatten())
            width = key[0].numel() + value_heads * value_dim + 2 * value_heads
            record = torch.cat((key.flatten(1), v[lane].float().flatten(1), g[lane], beta[lane]), dim=1)
            log[entry:entry + rows * width].copy_(record.flatten())
    return out


def reference_replay(log: torch.Tensor, log_at: torch.Tensor, states: torch.Tensor, from_at: torch.Tensor,
                     to_at: torch.Tensor, kept: torch.Tensor, *, key_heads: int, value_heads: int,
                     key_dim: int, value_dim: int) -> None:
    """``replay`` in torch, a lane at a time: ``_reference_step`` on logged rows."""
    size = value_heads * key_dim * value_dim
    width = key_heads * key_dim + value_heads * value_dim + 2 * value_heads
    ratio = value_heads // key_heads
    layers = from_at.numel() // kept.shape[0]  # offsets [lanes] or [layers, lanes]
    lanes = zip(from_at.flatten().tolist(), to_at.flatten().tolist(), log_at.flatten().tolist(),
                kept.tolist() * layers, strict=True)
    for at, to, entry, count in lanes:
        if at < 0:
            continue
        s = states[at:at + size].view(value_heads, key_dim, value_dim)
        records = log[entry:entry + count * width].view(count, width)
        for record in records:
            key, rest = record[:key_heads * key_dim].view(key_heads, key_dim), record[key_heads * key_dim:]
            v = rest[:value_heads * value_dim].view(value_heads, value_dim)
            g, beta = rest[value_heads * value_dim:].view(2, value_heads)
            s = _reference_step(s, key.repeat_interleave(ratio, dim=0), v, g, beta)
        states[to:to + size].copy_(s.flatten())

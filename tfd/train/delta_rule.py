"""The gated delta rule over whole batched sequences, differentiable (reference/model.md 2.4, step 6).

Training runs sequences of hundreds of tokens from a zero state and needs gradients, so this is
written for that case: ``chunked`` forms every chunk's in-chunk work (decays, the UT transform's
triangular solve, Q K^T) for all chunks of all sequences at once and walks the chunks only for the
state, which keeps the launches per layer few. The serving references (``tfd_kernels.gdn_prefill``'s
``reference_chunk``, ``tfd.model.gdn.recurrent``) take one lane's rows a chunk at a time and write
their state in place, which autograd cannot follow. ``naive`` is the per-token recurrence, kept
only to hold ``chunked`` to it in tests. Neither writes in place into a tensor that needs grad.

Shapes: q, k ``[batch, time, heads, key_dim]`` (value heads: GVA already expanded, q and k
l2-normalised, q scaled); v ``[batch, time, heads, value_dim]``; g (log decay, <= 0) and beta
``[batch, time, heads]``. All fp32; the output is ``[batch, time, heads, value_dim]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64


def chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
            chunk: int = CHUNK) -> torch.Tensor:
    """The rule a chunk at a time from a zero state (time padded with inert rows: g = beta = 0)."""
    batch, time, heads, _ = q.shape
    pad = (-time) % chunk
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))
    chunks = (time + pad) // chunk

    def blocks(x: torch.Tensor) -> torch.Tensor:  # [batch, heads, chunks, chunk, ...]
        return x.transpose(1, 2).reshape(batch, heads, chunks, chunk, *x.shape[3:])

    q, k, v, g, beta = (blocks(x) for x in (q, k, v, g, beta))
    total = g.cumsum(dim=-1)  # G_i: log decay from the chunk's start through row i
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = (total[..., :, None] - total[..., None, :]).masked_fill(~lower, float("-inf")).exp()
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    system = (k_beta @ k.transpose(-1, -2)) * decay  # I + L once its diagonal is read as ones
    u = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * total.exp()[..., None], upper=False,
                                      unitriangular=True)
    inner = (q @ k.transpose(-1, -2)) * decay
    last = total[..., -1:]
    k_out = k * (last - total).exp()[..., None]  # each row's key decayed to the chunk's end
    state = q.new_zeros(batch, heads, q.shape[-1], v.shape[-1])
    states, fresh = [], []
    for c in range(chunks):
        states.append(state)
        news = u[:, :, c] - w[:, :, c] @ state
        fresh.append(news)
        state = state * last[:, :, c, :, None].exp() + k_out[:, :, c].transpose(-1, -2) @ news
    before = torch.stack(states, dim=2)  # the state entering each chunk
    out = (q * total.exp()[..., None]) @ before + inner @ torch.stack(fresh, dim=2)
    return out.reshape(batch, heads, chunks * chunk, -1)[:, :, :time].transpose(1, 2)


def naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
          ) -> torch.Tensor:
    """The recurrence row by row: S <- e^g S; S <- S + k (beta (v - S^T k))^T; o = S^T q."""
    batch, time, heads, _ = q.shape
    state = q.new_zeros(batch, heads, q.shape[-1], v.shape[-1])
    out = []
    for t in range(time):
        state = state * g[:, t, :, None, None].exp()
        read = (state * k[:, t, :, :, None]).sum(dim=-2)
        delta = beta[:, t, :, None] * (v[:, t] - read)
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        out.append((state * q[:, t, :, :, None]).sum(dim=-2))
    return torch.stack(out, dim=1)

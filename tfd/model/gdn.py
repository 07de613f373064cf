"""Gated DeltaNet layers (reference/model.md 2.4): projections, causal conv, the delta rule.

Per lane the layer keeps a recurrent state S [value heads, key dim, value dim] in fp32 and the
conv tail, the last ``kernel - 1`` conv inputs. Prefill rows run the chunked form, chunks cut at
multiples of ``CHUNK`` absolute positions so a prefill split at such multiples gives the same bits
as one pass; decode rows run the recurrence. The two agree within float tolerance, not bit for
bit. Both update the lane's state and tail in place.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch

from tfd.model import GDN_CHUNK
from tfd.model.fp8 import Fp8Weight, Joined, Weight
from tfd.model.memory import LanesOnce, PromptLanes
from tfd.model.ops import Input, fp8_linear, gated_rms_into, l2norm, linear, sigmoid, softplus, values_of
from tfd_kernels import conv1d, gdn_decode, gdn_gates, gdn_prefill, gdn_reference, gemm

CHUNK = GDN_CHUNK


@attrs.frozen
class GdnWeights:
    """One GDN layer in the canonical layout: qkv rows are [all q | all k | all v]."""

    proj: Weight  # [channels + value_heads * value_dim + 2 * value_heads, hidden]: the rows of
    # qkv (channels = 2 * key_heads * key_dim + value_heads * value_dim), z, b and a in one product
    conv: torch.Tensor  # [channels, kernel]
    a_log: torch.Tensor  # [value_heads]
    dt_bias: torch.Tensor  # [value_heads]
    norm: torch.Tensor  # [value_dim]
    out: Weight  # [hidden, value_heads * value_dim]
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    activation: str  # of the output gate: silu, or sigmoid for Flash Next
    eps: float


@attrs.frozen
class Projected:
    """A GDN layer's inputs from its rows: conv input, output gate, beta and the log decay g."""

    mixed: torch.Tensor  # [rows, conv channels]
    z: torch.Tensor  # [rows, value_heads, value_dim]
    beta: torch.Tensor  # [rows, value_heads] fp32
    g: torch.Tensor  # [rows, value_heads] fp32


def split_projection(w: GdnWeights, projected: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The fused projection as views: conv input, z [rows, value_heads, value_dim], b, a."""
    rows, heads = projected.shape[0], w.value_heads
    channels = 2 * w.key_heads * w.key_dim + heads * w.value_dim
    mixed, z, b, a = torch.split(projected, [channels, heads * w.value_dim, heads, heads], dim=-1)
    return mixed, z.view(rows, heads, w.value_dim), b, a


def project(w: GdnWeights, x: torch.Tensor) -> Projected:
    mixed, z, b, a = split_projection(w, linear(x, w.proj))
    beta, g = gates(b, a, w.a_log, w.dt_bias)
    return Projected(mixed, z, beta, g)


def gates(b: torch.Tensor, a: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """beta = sigmoid(b) (rounded to the model dtype) and g = -exp(A_log) softplus(a + dt_bias), fp32."""
    if b.is_cuda:
        return gdn_gates.gates(b, a, a_log, dt_bias)
    beta = sigmoid(b).float()
    return beta, -torch.exp(a_log.float()) * softplus(a.float() + dt_bias.float())


def split_heads(w: GdnWeights, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The conv output as q, k [rows, key_heads, key_dim] and v [rows, value_heads, value_dim]."""
    rows, key_width = mixed.shape[0], w.key_heads * w.key_dim
    q, k, v = torch.split(mixed, [key_width, key_width, w.value_heads * w.value_dim], dim=-1)
    return (q.view(rows, w.key_heads, w.key_dim), k.view(rows, w.key_heads, w.key_dim),
            v.view(rows, w.value_heads, w.value_dim))


def finish(w: GdnWeights, out: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The gated norm of the rule's output [rows, value_heads, value_dim], then the out projection."""
    return linear(gated_rms_into(out, z, w.norm, w.eps, w.activation, w.out), w.out)


def gdn(w: GdnWeights, x: torch.Tensor, state: torch.Tensor, tail: torch.Tensor, start: int,
        decode: bool) -> torch.Tensor:
    """The layer's output for one lane's rows ``x`` [rows, hidden] at positions from ``start``.

    ``state`` and ``tail`` are the lane's views; they are updated to follow the last row. Prompt
    rows on CUDA take the Triton kernels (``gdn_chunks``).
    """
    if x.is_cuda and not decode:
        return gdn_chunks(w, x, state, tail, start)
    p = project(w, x)
    q, k, v = split_heads(w, conv1d.reference_lane(p.mixed, w.conv, tail))
    ratio = w.value_heads // w.key_heads  # value head j reads key head j // ratio
    q = l2norm(q.float()).repeat_interleave(ratio, dim=1) * w.key_dim ** -0.5
    k = l2norm(k.float()).repeat_interleave(ratio, dim=1)
    run = recurrent if decode else chunked
    out = run(q, k, v.float(), p.g, p.beta, state, start).to(x.dtype)
    return finish(w, out, p.z)


def gdn_chunks(w: GdnWeights, x: torch.Tensor, state: torch.Tensor, tail: torch.Tensor, start: int
               ) -> torch.Tensor:
    """``gdn`` for prompt rows by the Triton kernels (on any device they run on): the conv with the
    lane's tail, then the chunked rule at absolute 64-multiples from the lane's state, both in place
    on the lane's own views (each passed as a one-lane pool at offset 0)."""
    rows, device = x.shape[0], x.device
    zero = torch.zeros(1, dtype=torch.int64, device=device)
    bounds = torch.tensor([0, rows], dtype=torch.int32, device=device)
    starts = torch.tensor([start], dtype=torch.int64, device=device)
    return _prompt(w, x, lambda: (state.view(-1), zero, tail.view(-1), zero, bounds, starts, rows))


def gdn_spans(w: GdnWeights, x: torch.Tensor, lanes: PromptLanes | LanesOnce, layer: str) -> torch.Tensor:
    """``gdn`` for the prompt rows ``x`` [rows, hidden] of every lane of ``lanes`` at once: one
    product, one conv and one chunked-rule launch over all lanes, states and tails in place in the
    pool. A lane's rows come out with the bits they have alone (every step is lane-invariant)."""

    def where() -> Where:
        made = lanes.get()  # after the projection's launch: a forward's first layer makes them then
        state_at, tail_at = made.offsets_of(layer)
        return made.states, state_at, made.tails, tail_at, made.cu_seqlens, made.starts, made.max_rows

    return _prompt(w, x, where)


# A prompt pass's lane fields: the pool's states (fp32) and each lane's state offset, the tails (model dtype)
# and offsets, cu_seqlens, starts and the most rows of a lane
Where = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]


def _prompt(w: GdnWeights, x: torch.Tensor, where: Callable[[], Where]) -> torch.Tensor:
    """Prompt rows of varlen lanes through the kernels: projection, conv from each lane's tail, the
    chunked rule from each lane's state (both at element offsets of ``tails``/``states``), finish;
    the lane fields asked of ``where`` once the projection is launched."""
    p = project(w, x)
    states, state_at, tails, tail_at, cu_seqlens, starts, max_rows = where()
    q, k, v = split_heads(w, conv1d.prefill(p.mixed, w.conv, tails, tail_at, cu_seqlens, max_rows))
    out = gdn_prefill.prefill(q, k, v, p.g, p.beta, states, state_at, cu_seqlens, starts, w.key_dim ** -0.5,
                              max_rows)
    return finish(w, out, p.z)


def gdn_rows(w: GdnWeights, x: Input, states: torch.Tensor, state_at: torch.Tensor,
             tails: torch.Tensor, tail_at: torch.Tensor) -> torch.Tensor:
    """One decode row per lane, batched: ``x`` [lanes, hidden]; each lane's state and conv tail sit
    in the pool views ``states`` (fp32) and ``tails`` (model dtype) at element offsets
    ``state_at`` / ``tail_at`` [lanes] (-1: a padding lane, whose memory is not touched). Triton
    kernels on CUDA, their torch references elsewhere; either updates states and tails in place.
    On CUDA the projection's product applies the conv as it stores, and the rule's kernel forms the
    gates from the projection itself. ``x`` may come with its FP8 form (``Fp8Rows``): an FP8 projection's."""
    if values_of(x).is_cuda:  # the conv in the projection's last step (gemm.Conv): conv1d.decode's bits
        if isinstance(w.proj, torch.Tensor):
            projected = gemm.matmul(values_of(x), w.proj, conv=gemm.Conv(w.conv, tails, tail_at), early=True)
            mixed, z, b, a = split_projection(w, projected)
        else:
            mixed, z, b, a = _fp8_projected(w, x, tails, tail_at)
        q, k, v = split_heads(w, mixed)
        out = gdn_decode.decode_gated(q, k, v, b, a, w.a_log, w.dt_bias, states, state_at, w.key_dim ** -0.5)
        return finish(w, out, z)
    p = project(w, values_of(x))
    q, k, v = split_heads(w, conv1d.reference(p.mixed, w.conv, tails, tail_at))
    out = gdn_reference.reference(q, k, v, p.g, p.beta, states, state_at, w.key_dim ** -0.5)
    return finish(w, out, p.z)


def _fp8_projected(w: GdnWeights, x: Input, tails: torch.Tensor, tail_at: torch.Tensor
                   ) -> tuple[torch.Tensor, ...]:
    """An FP8 (or joined) GDN projection of decode rows, split, its conv columns convolved
    (``conv1d.decode``'s bits): in the FP8 product's store where its first part holds them (Qwen3.5's
    qkv|z beside the float b|a), else after the product, on the conv columns as they are."""
    channels = w.conv.shape[0]
    parts = w.proj.parts if isinstance(w.proj, Joined) else (w.proj,)
    first = parts[0]
    if isinstance(first, Fp8Weight) and first.shape[0] >= channels:
        head = fp8_linear(x, first, gemm.Conv(w.conv, tails, tail_at))
        rest = [linear(x, part) for part in parts[1:]]
        return split_projection(w, torch.cat([head, *rest], dim=-1) if rest else head)
    mixed, z, b, a = split_projection(w, linear(x, w.proj))  # picked rows: the conv's columns come after
    return conv1d.decode(mixed, w.conv, tails, tail_at), z, b, a


def recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              state: torch.Tensor, start: int) -> torch.Tensor:
    """The delta rule row by row: S <- e^g S; S <- S + k (beta (v - S^T k))^T; o = S^T q."""
    del start  # every row is the same arithmetic wherever it lies
    out = torch.empty_like(v)
    s = state.float()
    for row in range(q.shape[0]):
        s = s * torch.exp(g[row])[:, None, None]
        read = (s * k[row][:, :, None]).sum(dim=1)
        delta = beta[row][:, None] * (v[row] - read)
        s = s + k[row][:, :, None] * delta[:, None, :]
        out[row] = (s * q[row][:, :, None]).sum(dim=1)
    state.copy_(s)
    return out


def chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
            state: torch.Tensor, start: int) -> torch.Tensor:
    """The delta rule a chunk at a time; chunks end at multiples of ``CHUNK`` absolute positions."""
    out = torch.empty_like(v)
    s = state.float()
    row = 0
    while row < q.shape[0]:
        end = min(q.shape[0], row + CHUNK - (start + row) % CHUNK)
        piece = slice(row, end)
        out[piece], s = gdn_prefill.reference_chunk(q[piece], k[piece], v[piece], g[piece], beta[piece], s)
        row = end
    state.copy_(s)
    return out

"""Issue 31: how far one-pass tf32 products move the GDN prefill from exact, product group by product group,
emulated on the CPU (Triton's interpreter multiplies in fp32 whatever the precision). The chunked delta
rule of tfd_kernels.gdn_prefill in float64, each product's operands rounded as the tensor cores round them
when its group runs in one tf32 pass (10 mantissa bits, to nearest, ties away) and its result to fp32;
tf32x3 is taken as fp32 (its three passes carry about 21 bits). Errors of the output and the final state
against float64 with no rounding, beside bf16's own rounding of the output (2^-9 relative) as the scale
the next layer reads at. Inputs as a layer makes them: q and k normalized, v ~ N(0, 1), beta = sigmoid,
g = -softplus (decays), keys with a shared component (``--shared``) so that the inverse is not trivial.

    python docs/bench/kit/gdn_precision.py [--rows 8192] [--heads 4] [--shared 0.6] [--beta-bias 0]
"""

from __future__ import annotations

import argparse
import itertools

import torch

CHUNK = 64
GROUPS = ("inverse", "wu", "scan", "output")


def tf32(x: torch.Tensor) -> torch.Tensor:
    """``x`` (float64) rounded to tf32's 10 mantissa bits, to nearest, ties away (cvt.rna.tf32.f32)."""
    x32 = x.float()
    bits = x32.view(torch.int32)
    rounded = ((bits + 0x1000) & ~0x1FFF).view(torch.float32)  # add half an ulp of tf32, then cut
    return rounded.double()


def truncated(x: torch.Tensor) -> torch.Tensor:
    """``x`` (float64, as fp32) cut to tf32's bits: the high part of a two-pass split, exact in tf32."""
    return (x.float().view(torch.int32) & ~0x1FFF).view(torch.float32).double()


def two_pass(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for ``b`` exact in tf32: a's high part and the rest, each one tf32 pass (tf32x3 less its pass
    of b's rest, which is zero), summed in fp32."""
    a = a.float().double()
    high = truncated(a)
    return ((high @ b).float().double() + (tf32(a - high) @ b)).float().double()


def product(a: torch.Tensor, b: torch.Tensor, one_pass: bool) -> torch.Tensor:
    """a @ b with fp32 operands and an fp32 result; in one tf32 pass the operands first lose 13 bits."""
    a, b = a.float().double(), b.float().double()
    if one_pass:
        a, b = tf32(a), tf32(b)
    return (a @ b).float().double()


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        fast: frozenset[str], exact: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs [rows, heads, dv] and final states [heads, dk, dv]: ``exact`` in float64 throughout, else fp32
    with the groups in ``fast`` one tf32 pass."""
    rows, heads, dk = k.shape
    dv = v.shape[-1]
    out = torch.zeros(rows, heads, dv, dtype=torch.float64)
    states = torch.zeros(heads, dk, dv, dtype=torch.float64)

    def mm(a: torch.Tensor, b: torch.Tensor, group: str) -> torch.Tensor:
        return a @ b if exact else product(a, b, group in fast)

    t = torch.arange(CHUNK)
    for h in range(heads):
        s = states[h]
        for start in range(0, rows, CHUNK):
            sl = slice(start, start + CHUNK)
            kc, qc, vc, bc = k[sl, h], q[sl, h], v[sl, h], beta[sl, h]
            total = torch.cumsum(g[sl, h], 0)
            lower = t[:, None] >= t[None, :]
            decay = torch.where(lower, torch.exp(total[:, None] - total[None, :]), 0.0)
            a = torch.where(t[:, None] > t[None, :], bc[:, None] * (kc @ kc.T) * decay, 0.0)
            x = torch.eye(CHUNK, dtype=torch.float64)  # the doubling, as tfd_kernels.gdn_chunk does it
            refine = not exact and "refined" in fast
            for level in range(CHUNK.bit_length() - 1):
                left = ((t[:, None] >> level + 1) == (t[None, :] >> level + 1)) & \
                    ((t[:, None] >> level) != (t[None, :] >> level))
                off = torch.where(left, a, 0.0)
                group = "inverse" if not refine else "refined"
                x = x - off if level == 0 else x - mm(mm(x, off, group), x, group)
            if refine:  # one Newton step: X + X E, E = I - X - a X, X cut to tf32 so a X takes two passes
                x = truncated(x)
                residual = (torch.eye(CHUNK, dtype=torch.float64) - x - two_pass(a, x)).float().double()
                x = (x + product(x, residual, True)).float().double()
            if not exact and "wu2" in fast:  # T's columns scaled, then the raw bf16 rows: two passes
                w = two_pass(x * (bc * torch.exp(total))[None, :], kc)
                u = two_pass(x * bc[None, :], vc)
            else:
                w = mm(x, (bc * torch.exp(total))[:, None] * kc, "wu")
                u = mm(x, bc[:, None] * vc, "wu")
            fresh = u - mm(w, s, "scan")
            p = (qc @ kc.T) * decay
            out[sl, h] = mm(torch.exp(total)[:, None] * qc, s, "output") + mm(p, fresh, "output")
            last = total[-1]
            s = torch.exp(last) * s + mm((torch.exp(last - total)[:, None] * kc).T, fresh, "scan")
        states[h] = s
    return out, states


def relative(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x - ref).norm() / ref.norm()).item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--shared", type=float, default=0.6, help="the keys' shared component")
    parser.add_argument("--beta-bias", type=float, default=0.0, help="beta = sigmoid(N(0, 1) + this)")
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    rows, heads, dim = args.rows, args.heads, 128

    def normed(x: torch.Tensor) -> torch.Tensor:
        return x / x.norm(dim=-1, keepdim=True)

    common = torch.randn(1, heads, dim, generator=gen, dtype=torch.float64)
    k = normed(args.shared * normed(common) + (1 - args.shared) * normed(
        torch.randn(rows, heads, dim, generator=gen, dtype=torch.float64)))
    q = normed(torch.randn(rows, heads, dim, generator=gen, dtype=torch.float64)) * dim ** -0.5
    v = torch.randn(rows, heads, dim, generator=gen, dtype=torch.float64)
    g = -torch.nn.functional.softplus(torch.randn(rows, heads, generator=gen, dtype=torch.float64) - 3)
    beta = torch.sigmoid(torch.randn(rows, heads, generator=gen, dtype=torch.float64) + args.beta_bias)
    k, q, v = (x.bfloat16().double() for x in (k, q, v))  # as a bf16 layer hands them on
    ref_out, ref_state = run(q, k, v, g, beta, frozenset(), exact=True)
    bf16 = relative(ref_out.bfloat16().double(), ref_out)
    print(f"{rows} rows, {heads} heads, shared {args.shared}, beta bias {args.beta_bias}: bf16's own rounding of "
          f"the output {bf16:.2e}")
    tried = [fast for n in range(len(GROUPS) + 1) for fast in itertools.combinations(GROUPS, n)
             if n in (0, 1, len(GROUPS)) or fast in (("wu", "scan", "output"), ("wu", "output"))]
    for fast in [*tried, ("refined",), ("wu2",), ("refined", "wu2")]:
        if True:
            out, state = run(q, k, v, g, beta, frozenset(fast), exact=False)
            print(f"one pass: {','.join(fast) or 'none (tf32x3 everywhere)':28} output {relative(out, ref_out):.2e} "
                  f"({relative(out, ref_out) / bf16:.3f} of bf16's), state {relative(state, ref_state):.2e}",
                  flush=True)


if __name__ == "__main__":
    main()

"""Random inputs of the MoE kernels' tests (tests/kernels/test_moe.py, test_moe_block.py): experts,
the router's product, the shared expert, the residual, at tiny sizes for the interpreter and at the
real models' sizes for the GPU."""

from __future__ import annotations

import torch

from tfd_kernels import moe

Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def make(rows: int, top_k: int, dtype: torch.dtype, seed: int, *, experts: int = 8, hidden: int = 64,
         inner: int = 32, device: str = "cpu") -> Inputs:
    """Random inputs; rows share experts, the last expert is chosen by none, ids are not sorted."""
    generator = torch.Generator(device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device=device)

    x = randn(rows, hidden).to(dtype)
    gate_up = (randn(experts, 2 * inner, hidden) * hidden ** -0.5).to(dtype)
    down = (randn(experts, hidden, inner) * inner ** -0.5).to(dtype)
    ids = torch.rand(rows, experts - 1, generator=generator, device=device).argsort(dim=1)[:, :top_k]
    weights = torch.rand(rows, top_k, generator=generator, device=device) + 0.1
    return x, gate_up, down, ids, weights


def router_product(rows: int, experts: int, dtype: torch.dtype, seed: int, device: str = "cpu"
                   ) -> torch.Tensor:
    """Random router logits [rows, experts + 1], the shared expert's gate last (the model's one product)."""
    generator = torch.Generator(device).manual_seed(seed + 1000)
    return (torch.randn(rows, experts + 1, generator=generator, device=device) * 3).to(dtype)


def make_shared(rows: int, dtype: torch.dtype, seed: int, *, experts: int = 8, hidden: int = 64,
                inner: int = 32, device: str = "cpu") -> moe.Shared:
    """A random shared expert of ``inner``, its gate read in place from ``router_product``'s last column."""
    generator = torch.Generator(device).manual_seed(seed + 2000)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device=device)

    return moe.Shared((randn(2 * inner, hidden) * hidden ** -0.5).to(dtype),
                      (randn(hidden, inner) * inner ** -0.5).to(dtype),
                      router_product(rows, experts, dtype, seed, device)[:, experts:])


def gate_rows(shared: moe.Shared, rows: slice | torch.Tensor) -> moe.Shared:
    """The shared expert with its gate's ``rows`` (the rows x keeps)."""
    return shared._replace(gate=shared.gate[rows])


def rows_alone(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, ids: torch.Tensor,
               weights: torch.Tensor) -> torch.Tensor:
    return torch.cat([moe.experts(x[i:i + 1], gate_up, down, ids[i:i + 1], weights[i:i + 1])
                      for i in range(x.shape[0])])


def assert_rows_as_in_the_batch(inputs: Inputs, shared: moe.Shared, batch: torch.Tensor,
                                prefixes: tuple[int, ...], singles: tuple[int, ...]) -> None:
    """The batch's first rows and single rows, run on their own with the shared expert, give its bits."""
    x, gate_up, down, ids, weights = inputs
    for rows in prefixes:
        got = moe.experts(x[:rows], gate_up, down, ids[:rows], weights[:rows], gate_rows(shared, slice(rows)))
        assert torch.equal(got, batch[:rows])
    for row in singles:
        part = slice(row, row + 1)
        alone = moe.experts(x[part], gate_up, down, ids[part], weights[part], gate_rows(shared, part))
        assert torch.equal(alone[0], batch[row])


def assert_near(got: torch.Tensor, want: torch.Tensor) -> None:
    tolerance = TOLERANCE[got.dtype]
    torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)



def residual_of(rows: int, dtype: torch.dtype, seed: int, hidden: int = 64, device: str = "cpu"
                ) -> moe.Residual:
    generator = torch.Generator(device).manual_seed(seed + 3000)
    x = torch.randn(rows, hidden, generator=generator, device=device).to(dtype)
    return moe.Residual(x, (torch.randn(hidden, generator=generator, device=device) * 0.1).to(dtype), 1e-6)



REAL = [(256, 8), (512, 10)]  # Qwen3.5-35B-A3B and Qwen3-Next-80B-A3B: experts, top_k


def make_real(rows: int, experts: int, top_k: int, seed: int) -> Inputs:
    return make(rows, top_k, torch.bfloat16, seed, experts=experts, hidden=2048, inner=512, device="cuda")


def make_real_shared(rows: int, experts: int, seed: int) -> moe.Shared:
    return make_shared(rows, torch.bfloat16, seed, experts=experts, hidden=2048, inner=512, device="cuda")


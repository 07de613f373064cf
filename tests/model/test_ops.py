"""The row-invariant primitives: a row's bits never depend on the rows beside it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from tfd.model import ops

WIDTHS = (4, 24, 48, 100)  # not multiples of 64: where torch's own sigmoid and silu move


def rows_alone(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return torch.cat([fn(x[i:i + 1]) for i in range(x.shape[0])])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["sigmoid", "silu", "softplus"])
def test_activations_are_the_same_alone_and_in_a_batch(name: str, dtype: torch.dtype) -> None:
    fn = getattr(ops, name)
    for width in WIDTHS:
        x = (torch.randn(301, width, generator=torch.Generator().manual_seed(width)) * 8).to(dtype)
        assert torch.equal(fn(x), rows_alone(fn, x)), width


def test_torch_own_sigmoid_is_not_row_invariant() -> None:
    """Why ops has its own: the reason to keep them, checked on the torch in use."""
    x = torch.randn(30, 24, generator=torch.Generator().manual_seed(0))
    moved = not torch.equal(torch.sigmoid(x), rows_alone(torch.sigmoid, x)) or \
        not torch.equal(F.silu(x), rows_alone(F.silu, x))
    if not moved:
        pytest.skip("this torch build computes sigmoid the same everywhere")


Activation = Callable[[torch.Tensor], torch.Tensor]


@pytest.mark.parametrize(("name", "reference"), [("sigmoid", torch.sigmoid), ("silu", F.silu),
                                                 ("softplus", F.softplus)])
def test_activations_agree_with_torch_to_float_precision(name: str, reference: Activation) -> None:
    x = torch.linspace(-60, 60, 10001)
    torch.testing.assert_close(getattr(ops, name)(x), reference(x), rtol=2e-6, atol=1e-30)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [48, 64, 1024])
def test_linear_rows_are_the_same_alone_and_in_a_batch(width: int, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(width)
    weight = torch.randn(96, width, generator=generator).to(dtype)
    x = torch.randn(300, width, generator=generator).to(dtype)
    alone = rows_alone(lambda r: ops.linear(r, weight), x)
    assert torch.equal(ops.linear(x, weight), alone)
    # batches of a block less one, a block, a block and one: a row at every place of its block
    for count in (ops.ROW_BLOCK - 1, ops.ROW_BLOCK, ops.ROW_BLOCK + 1):
        for first in range(0, 2 * ops.ROW_BLOCK):
            assert torch.equal(ops.linear(x[first:first + count], weight), alone[first:first + count])
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(ops.linear(x, weight).float(), x.float() @ weight.float().T,
                               rtol=tolerance, atol=tolerance * width ** 0.5)


def test_torch_own_product_of_one_row_is_not_a_batchs() -> None:
    """Why the CPU's products take blocks of a fixed size: torch's one-row product and a batch's give
    a row other bits, checked on the torch in use."""
    generator = torch.Generator().manual_seed(0)
    weight, x = torch.randn(128, 64, generator=generator), torch.randn(40, 64, generator=generator)
    if torch.equal(F.linear(x, weight), rows_alone(lambda r: F.linear(r, weight), x)):
        pytest.skip("this torch build computes a row's product the same in any batch")


def test_zero_centred_norm_per_group() -> None:
    x = torch.randn(5, 8)
    weight = torch.randn(8)
    grouped = ops.zrms(x, weight, 1e-6, group=4)
    halves = torch.cat([ops.zrms(x[:, :4], weight[:4], 1e-6), ops.zrms(x[:, 4:], weight[4:], 1e-6)], dim=1)
    torch.testing.assert_close(grouped, halves)
    torch.testing.assert_close(ops.zrms(x, torch.zeros(8), 1e-6).pow(2).mean(-1), torch.ones(5))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_sums_are_the_same_alone_and_in_a_batch(device: str, dtype: torch.dtype) -> None:
    """PLE's scores: a lane's four stream sums of 2560 whether 1 or 64 lanes share the call."""
    x = torch.randn(64, 4, 2560, generator=torch.Generator().manual_seed(1)).to(device=device, dtype=dtype)
    sums = ops.row_sums(x)
    assert sums.shape == (64, 4) and sums.dtype == dtype
    for rows in (1, 2, 3, 8):
        assert torch.equal(ops.row_sums(x[:rows]), sums[:rows]), rows
    narrow = dtype == torch.bfloat16  # the sums rounded to bf16: a quarter near 50
    torch.testing.assert_close(sums.float(), x.float().sum(dim=-1), rtol=2e-2 if narrow else 1e-5,
                               atol=0.3 if narrow else 1e-3)

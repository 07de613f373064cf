"""Flash Next's hyper-connection launches against the torch composition they replace
(``tfd.model.hyper``'s CPU path): the same values in fp32, and a row's bits alone as in a batch.
Widths that fill a power-of-two block and widths that do not, and a width past one program's block.

In bf16 the interpreter rounds toward zero where the GPU rounds to nearest, so here bf16 results
are held within a few units in the last place (every cast point moves a value by one at most); on
the GPU the write is the composition bit for bit and the read within one unit (``tl.exp`` is not
torch's ``expf``)."""

from __future__ import annotations

import pytest
import torch

from tfd.model.hyper import HyperWeights
from tfd.model.ops import linear, sigmoid, silu, zrms
from tfd_kernels import hyper as hyper_kernels
from tfd_kernels import norm as norm_kernels

STREAMS = 4
RANK = 12


def weights(width: int, injects: bool, dtype: torch.dtype, seed: int = 0) -> HyperWeights:
    g = torch.Generator().manual_seed(seed)
    wide = STREAMS * width

    def draw(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    rows = RANK + (STREAMS if injects else 0)
    return HyperWeights(norm=draw(wide, scale=0.3), projections=draw(rows, wide, scale=wide ** -0.5),
                        up=draw(wide, RANK, scale=RANK ** -0.5), streams=STREAMS, width=width, eps=1e-6)


def composed(w: HyperWeights, stack: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """hyper.read's torch ops on any device, the products and the norm as its kernels' path has them."""
    normed = zrms(stack, w.norm, w.eps, group=w.width)
    projected = linear(normed, w.projections)
    mix = sigmoid(linear(silu(projected[:, :w.rank] / w.streams), w.up))
    split = (w.streams, w.width)
    block = (torch.unflatten(mix, -1, split) * torch.unflatten(normed, -1, split)).mean(dim=-2)
    return block, 2 * sigmoid(projected[:, w.rank:] / w.streams) if w.injects else None


def launched(w: HyperWeights, stack: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """hyper.read's CUDA path on this device: the interpreted launches between torch's products."""
    normed = zrms(stack, w.norm, w.eps, group=w.width)
    mixed, injected = hyper_kernels.gates(linear(normed, w.projections), w.rank, w.streams)
    return hyper_kernels.block_input(linear(mixed, w.up), normed, w.streams, w.width), injected


def close(got: torch.Tensor, want: torch.Tensor, ulps: int = 4) -> bool:
    if got.dtype == torch.float32:
        return torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    # bf16 keeps 8 significant bits: a unit in the last place is 2^-7 of a value at most; the
    # values summed are near 1, so a mean that cancels is held to their scale, not its own
    step = ulps * 2.0 ** -7
    return bool(((got.float() - want.float()).abs() <= step * (want.float().abs() + 1.0)).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [16, 40, 1040])  # fills a block of 16; not; past one of 1024
@pytest.mark.parametrize("injects", [True, False])
def test_a_read_gives_the_compositions_block_input_and_weights(
        dtype: torch.dtype, width: int, injects: bool) -> None:
    w = weights(width, injects, dtype)
    stack = torch.randn(5, STREAMS * width, generator=torch.Generator().manual_seed(1)).to(dtype)
    (got, got_weights), (want, want_weights) = launched(w, stack), composed(w, stack)
    assert got.shape == want.shape == (5, width) and close(got, want)
    if injects:
        assert got_weights is not None and want_weights is not None
        assert got_weights.shape == (5, STREAMS) and close(got_weights, want_weights)
    else:
        assert got_weights is None and want_weights is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [40, 1040])
def test_a_write_gives_the_compositions_streams(dtype: torch.dtype, width: int) -> None:
    g = torch.Generator().manual_seed(2)
    stack = torch.randn(3, STREAMS * width, generator=g).to(dtype)
    output = torch.randn(3, width, generator=g).to(dtype)
    scale = torch.rand(3, STREAMS, generator=g).to(dtype)
    want = stack + (output[:, None, :] * scale[:, :, None]).flatten(-2)
    assert close(hyper_kernels.write(stack, output, scale), want, ulps=2)  # a product and a sum, each rounded


def test_a_rows_bits_are_the_same_alone_and_in_a_batch() -> None:
    w = weights(40, True, torch.bfloat16)
    stack = torch.randn(6, STREAMS * 40, generator=torch.Generator().manual_seed(3)).bfloat16()
    together, together_weights = launched(w, stack)
    alone, alone_weights = launched(w, stack[4:5])
    assert together_weights is not None and alone_weights is not None
    assert torch.equal(alone[0], together[4]) and torch.equal(alone_weights[0], together_weights[4])
    output = torch.randn(6, 40, generator=torch.Generator().manual_seed(4)).bfloat16()
    assert torch.equal(hyper_kernels.write(stack[4:5], output[4:5], together_weights[4:5])[0],
                       hyper_kernels.write(stack, output, together_weights)[4])


def test_shapes_that_do_not_fit_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"projected is \[2, 13\]: want \[rows, 12\] or \[rows, 16\]$"):
        hyper_kernels.gates(torch.zeros(2, 13), RANK, STREAMS)
    with pytest.raises(ValueError, match=r"up \[2, 160\] and normed \[2, 80\]"):
        hyper_kernels.block_input(torch.zeros(2, 160), torch.zeros(2, 80), STREAMS, 40)
    with pytest.raises(ValueError, match=r"stack \[2, 100\], output \[2, 40\], weights \[2, 4\]"):
        hyper_kernels.write(torch.zeros(2, 100), torch.zeros(2, 40), torch.zeros(2, 4))


@pytest.mark.gpu
@pytest.mark.parametrize("width", [40, 2560])
def test_on_the_gpu_a_write_is_the_composition_and_a_read_within_a_unit(width: int) -> None:
    w = weights(width, True, torch.bfloat16)
    w = HyperWeights(w.norm.cuda(), w.projections.cuda(), w.up.cuda(), w.streams, w.width, w.eps)
    stack = torch.randn(33, STREAMS * width, device="cuda").bfloat16()
    (got, got_weights), (want, want_weights) = launched(w, stack), composed(w, stack)
    assert got_weights is not None and want_weights is not None
    assert close(got, want, ulps=1) and close(got_weights, want_weights, ulps=1)
    output, scale = torch.randn(33, width, device="cuda").bfloat16(), got_weights
    assert torch.equal(hyper_kernels.write(stack, output, scale),
                       stack + (output[:, None, :] * scale[:, :, None]).flatten(-2))


def test_columns_apart_are_read_as_adjacent_ones() -> None:
    """A slice of a wider tensor (columns one apart, a longer row stride) or its transpose's view
    (columns apart): the same values as the contiguous inputs."""
    g = torch.Generator().manual_seed(5)
    wide = torch.randn(3, 200, generator=g)
    output, scale = torch.randn(40, 3, generator=g).T, torch.rand(3, STREAMS, generator=g)
    assert output.stride(1) != 1
    stack = wide[:, :STREAMS * 40]  # a row stride of 200
    assert torch.equal(hyper_kernels.write(stack, output, scale),
                       hyper_kernels.write(stack.contiguous(), output.contiguous(), scale))


@pytest.mark.parametrize("width", [16, 40])  # fills its power-of-two block; does not
def test_a_write_with_the_next_norm_is_the_write_then_the_grouped_norm(width: int) -> None:
    g = torch.Generator().manual_seed(6)
    stack, output = torch.randn(5, STREAMS * width, generator=g), torch.randn(5, width, generator=g)
    scale, norm = torch.rand(5, STREAMS, generator=g), torch.randn(STREAMS * width, generator=g) * 0.1
    written, normed = hyper_kernels.write_norm(stack, output, scale, norm, 1e-6)
    assert torch.equal(written, hyper_kernels.write(stack, output, scale))
    assert torch.equal(normed, norm_kernels.zrms(written, norm, 1e-6, group=width))  # each stream its own
    alone = hyper_kernels.write_norm(stack[3:4], output[3:4], scale[3:4], norm, 1e-6)
    assert torch.equal(alone[0][0], written[3]) and torch.equal(alone[1][0], normed[3])
    with pytest.raises(ValueError, match=r"norm \[40\]"):
        hyper_kernels.write_norm(stack, output, scale, norm[:40], 1e-6)


@pytest.mark.gpu
def test_on_the_gpu_a_write_with_the_next_norm_has_the_two_launches_bits() -> None:
    """Flash Next's 2,560-wide streams: the decode path's one launch against the write and the norm
    launched apart (which the span path used before), bit for bit."""
    g = torch.Generator().manual_seed(7)
    stack = torch.randn(33, STREAMS * 2560, generator=g).bfloat16().cuda()
    output = torch.randn(33, 2560, generator=g).bfloat16().cuda()
    scale = (torch.rand(33, STREAMS, generator=g) + 0.5).bfloat16().cuda()
    norm = (torch.randn(STREAMS * 2560, generator=g) * 0.1).bfloat16().cuda()
    written, normed = hyper_kernels.write_norm(stack, output, scale, norm, 1e-6)
    assert torch.equal(written, hyper_kernels.write(stack, output, scale))
    assert torch.equal(normed, norm_kernels.zrms(written, norm, 1e-6, group=2560))

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


@pytest.mark.parametrize("rows", [5, 16, 17, 64, 65])  # each side of the row tiles' bounds
@pytest.mark.parametrize("injects", [True, False])
def test_the_mix_in_one_launch_is_the_gates_the_up_product_and_the_mean(rows: int, injects: bool) -> None:
    """``mix`` against the three launches it replaces, in fp32 (the up product's sums in another order
    than the GEMM's: within fp32 rounding), with a rank past one K tile and not a multiple of it
    (RANK is 12; here 80) and a width past one column tile and not a multiple of it."""
    rank, width = 80, 72
    g = torch.Generator().manual_seed(8)
    projected = torch.randn(rows, rank + (STREAMS if injects else 0), generator=g)
    up = torch.randn(STREAMS * width, rank, generator=g) * rank ** -0.5
    normed = torch.randn(rows, STREAMS * width, generator=g)
    got, got_weights = hyper_kernels.mix(projected, up, normed, STREAMS, width)
    mixed, want_weights = hyper_kernels.gates(projected, rank, STREAMS)
    want = hyper_kernels.block_input(linear(mixed, up), normed, STREAMS, width)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    if injects:
        assert got_weights is not None and want_weights is not None and torch.equal(got_weights, want_weights)
    else:
        assert got_weights is None and want_weights is None
    alone = hyper_kernels.mix(projected[3:4], up, normed[3:4], STREAMS, width)[0]
    assert torch.equal(alone[0], got[3])  # a row's bits alone as in a batch, whatever its tile


@pytest.mark.parametrize("rows", [1, 17])
# K tiles of 64: rank 80 is two (one or both early, or more asked for than there are), rank 200 four
@pytest.mark.parametrize(("rank", "early"), [(80, 1), (80, 2), (80, 5), (200, 3)])
def test_the_mix_asking_for_its_first_weights_early_changes_no_bits(rows: int, rank: int, early: int,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(10)
    projected = torch.randn(rows, rank + STREAMS, generator=g)
    up = torch.randn(STREAMS * 72, rank, generator=g) * rank ** -0.5
    normed = torch.randn(rows, STREAMS * 72, generator=g)
    plain = hyper_kernels.mix(projected, up, normed, STREAMS, 72)
    assert hyper_kernels.MIX_K == 64
    monkeypatch.setattr(hyper_kernels, "MIX_EARLY", early)
    early = hyper_kernels.mix(projected, up, normed, STREAMS, 72)
    assert torch.equal(early[0], plain[0]) and early[1] is not None and plain[1] is not None
    assert torch.equal(early[1], plain[1])


def test_the_mix_rows_tried_cross_each_row_tile_bound() -> None:
    tiles = [hyper_kernels.mix_tile(rows) for rows in (16, 17, 64, 65)]
    prompt = (hyper_kernels.MIX_PROMPT_ROWS, hyper_kernels.MIX_PROMPT_COLUMNS)
    assert tiles[0] != tiles[1] == tiles[2] != tiles[3] == prompt


@pytest.mark.parametrize("rows", [1, 16, 17])  # either side of the decode tiles' row bound
def test_a_decode_mixs_columns_change_no_bits(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(12)
    projected = torch.randn(rows, 80 + STREAMS, generator=g)
    up = torch.randn(STREAMS * 72, 80, generator=g) * 80 ** -0.5
    normed = torch.randn(rows, STREAMS * 72, generator=g)
    plain = hyper_kernels.mix(projected, up, normed, STREAMS, 72)
    for columns in (8, 32):  # 9 and 3 column tiles of the 72 (16: 5)
        monkeypatch.setattr(hyper_kernels, "MIX_COLUMNS", columns)
        assert hyper_kernels.mix_tile(rows)[1] == columns
        got = hyper_kernels.mix(projected, up, normed, STREAMS, 72)
        assert torch.equal(got[0], plain[0]) and got[1] is not None and plain[1] is not None
        assert torch.equal(got[1], plain[1])


@pytest.mark.parametrize("rows", [65, 130])  # one prompt tile and a part, past the first of the other tiles
def test_a_prompt_mixs_tile_and_launch_change_no_bits(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(11)
    projected = torch.randn(rows, 80 + STREAMS, generator=g)
    up = torch.randn(STREAMS * 72, 80, generator=g) * 80 ** -0.5
    normed = torch.randn(rows, STREAMS * 72, generator=g)
    plain = hyper_kernels.mix(projected, up, normed, STREAMS, 72)
    for name, value in (("MIX_PROMPT_ROWS", 128), ("MIX_PROMPT_COLUMNS", 16), ("MIX_PROMPT_WARPS", 8),
                        ("MIX_PROMPT_STAGES", 2)):
        monkeypatch.setattr(hyper_kernels, name, value)
    other = hyper_kernels.mix(projected, up, normed, STREAMS, 72)
    assert torch.equal(other[0], plain[0]) and other[1] is not None and plain[1] is not None
    assert torch.equal(other[1], plain[1])


@pytest.mark.parametrize("rows", [64, 65, 130])  # the last decode tile's rows, then a prompt's
def test_a_prompts_mix_may_run_as_the_three_launches(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(13)
    projected = torch.randn(rows, 80 + STREAMS, generator=g)
    up = torch.randn(STREAMS * 72, 80, generator=g) * 80 ** -0.5
    normed = torch.randn(rows, STREAMS * 72, generator=g)
    one = hyper_kernels.mix(projected, up, normed, STREAMS, 72)
    products = []
    plain = hyper_kernels.gemm.matmul
    monkeypatch.setattr(hyper_kernels.gemm, "matmul", lambda *a, **k: products.append(1) or plain(*a, **k))
    monkeypatch.setattr(hyper_kernels, "MIX_PROMPT_SPLIT", 1)
    got, got_weights = hyper_kernels.mix(projected, up, normed, STREAMS, 72)
    if rows <= hyper_kernels.MIX_TILES[-1][0]:  # decode rows: the one launch whatever the switch
        assert not products and torch.equal(got, one[0])
    else:
        assert products == [1]  # the split's up product
        mixed, _ = hyper_kernels.gates(projected, 80, STREAMS)
        assert torch.equal(got, hyper_kernels.block_input(plain(mixed, up), normed, STREAMS, 72))
        assert torch.allclose(got, one[0], rtol=1e-5, atol=1e-6)  # fp32: the one launch's sums in its order
    assert got_weights is not None and one[1] is not None and torch.equal(got_weights, one[1])


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [65, 1024])  # a prompt's smallest mix and Flash Next's 1,024-row prefill
def test_on_the_gpu_a_prompts_mix_in_three_launches_has_the_one_launchs_bits(
        rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(14)
    projected = torch.randn(rows, 324, generator=g).bfloat16().cuda()
    up = (torch.randn(4 * 2560, 320, generator=g) * 320 ** -0.5).bfloat16().cuda()
    normed = torch.randn(rows, 4 * 2560, generator=g).bfloat16().cuda()
    one, one_weights = hyper_kernels.mix(projected, up, normed, 4, 2560)
    monkeypatch.setattr(hyper_kernels, "MIX_PROMPT_SPLIT", 1)
    got, got_weights = hyper_kernels.mix(projected, up, normed, 4, 2560)
    assert torch.equal(got, one) and got_weights is not None and one_weights is not None
    assert torch.equal(got_weights, one_weights)
    for row in (0, rows - 1):  # a row alone runs a decode tile's one launch: its bits as in the prompt
        assert torch.equal(hyper_kernels.mix(projected[row:row + 1], up, normed[row:row + 1], 4, 2560)[0][0],
                           got[row])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "streams", "injects"), [(64, 4, True), (65, 4, True), (130, 4, False),
                                                          (65, 2, True), (65, 8, True)])
def test_a_prompts_mix_with_the_streams_apart_has_the_one_launchs_bits(
        rows: int, streams: int, injects: bool, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """64 rows: a decode tile's launch either way; past them the prompt's, apart up to 4 streams (8: the
    one launch still). Rank 80 (two K tiles, the second part empty), width 72 (a column tile and a part)."""
    g = torch.Generator().manual_seed(15)
    projected = torch.randn(rows, 80 + (streams if injects else 0), generator=g).to(dtype)
    up = (torch.randn(streams * 72, 80, generator=g) * 80 ** -0.5).to(dtype)
    normed = torch.randn(rows, streams * 72, generator=g).to(dtype)
    one, one_weights = hyper_kernels.mix(projected, up, normed, streams, 72)
    launched = []
    plain = hyper_kernels._mix_apart.run
    monkeypatch.setattr(hyper_kernels._mix_apart, "run", lambda *a, **k: launched.append(1) or plain(*a, **k))
    monkeypatch.setattr(hyper_kernels, "MIX_PROMPT_APART", 1)
    got, got_weights = hyper_kernels.mix(projected, up, normed, streams, 72)
    assert bool(launched) == (rows > hyper_kernels.MIX_TILES[-1][0] and streams <= 4)
    assert torch.equal(got, one)
    if injects:
        assert got_weights is not None and one_weights is not None and torch.equal(got_weights, one_weights)
    else:
        assert got_weights is None and one_weights is None


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [65, 1024])
def test_on_the_gpu_a_prompts_mix_with_the_streams_apart_has_the_one_launchs_bits(
        rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(16)
    projected = torch.randn(rows, 324, generator=g).bfloat16().cuda()
    up = (torch.randn(4 * 2560, 320, generator=g) * 320 ** -0.5).bfloat16().cuda()
    normed = torch.randn(rows, 4 * 2560, generator=g).bfloat16().cuda()
    one, one_weights = hyper_kernels.mix(projected, up, normed, 4, 2560)
    monkeypatch.setattr(hyper_kernels, "MIX_PROMPT_APART", 1)
    for columns, warps in ((32, 4), (64, 8), (16, 4)):
        monkeypatch.setattr(hyper_kernels, "MIX_PROMPT_COLUMNS", columns)
        monkeypatch.setattr(hyper_kernels, "MIX_PROMPT_WARPS", warps)
        got, got_weights = hyper_kernels.mix(projected, up, normed, 4, 2560)
        assert torch.equal(got, one), f"{columns} columns, {warps} warps"
        assert got_weights is not None and one_weights is not None and torch.equal(got_weights, one_weights)


def test_a_mix_of_streams_not_a_power_of_two_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="streams a power of 2"):
        hyper_kernels.mix(torch.zeros(2, 12), torch.zeros(3 * 8, 12), torch.zeros(2, 3 * 8), 3, 8)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 16, 17, 64, 65, 100])  # each side of the row tiles' bounds
def test_on_the_gpu_the_mix_is_within_a_unit_and_a_rows_bits_stay_its_own(
        rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flash Next's sizes (4 streams of 2,560, rank 320, bf16): within a unit of the three launches'
    result, and each row's bits alone as in batches of either row tile."""
    g = torch.Generator().manual_seed(9)
    projected = torch.randn(rows, 324, generator=g).bfloat16().cuda()
    up = (torch.randn(4 * 2560, 320, generator=g) * 320 ** -0.5).bfloat16().cuda()
    normed = torch.randn(rows, 4 * 2560, generator=g).bfloat16().cuda()
    got, got_weights = hyper_kernels.mix(projected, up, normed, 4, 2560)
    mixed, want_weights = hyper_kernels.gates(projected, 320, 4)
    want = hyper_kernels.block_input(linear(mixed, up), normed, 4, 2560)
    assert close(got, want, ulps=2) and got_weights is not None and want_weights is not None
    assert torch.equal(got_weights, want_weights)
    for row in {0, rows // 2, rows - 1}:
        assert torch.equal(hyper_kernels.mix(projected[row:row + 1], up, normed[row:row + 1], 4, 2560)[0][0],
                           got[row])
    for early in (1, 5):  # the first of rank 320's five tiles of weights early, or all of them
        monkeypatch.setattr(hyper_kernels, "MIX_EARLY", early)
        assert torch.equal(hyper_kernels.mix(projected, up, normed, 4, 2560)[0], got)
    monkeypatch.setattr(hyper_kernels, "MIX_EARLY", 0)
    for name, value in (("MIX_PROMPT_ROWS", 128), ("MIX_PROMPT_COLUMNS", 64), ("MIX_PROMPT_WARPS", 8)):
        monkeypatch.setattr(hyper_kernels, name, value)  # a prompt's other tile: the same bits (a sweep's)
    assert torch.equal(hyper_kernels.mix(projected, up, normed, 4, 2560)[0], got)

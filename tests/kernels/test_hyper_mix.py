"""Flash Next's hyper read in one launch (``tfd_kernels.hyper_mix``) against the three launches it fuses
(``tfd_kernels.hyper``'s gates and block input around the batch-invariant product): within fp32 rounding in
the interpreter, a row's bits alone as in a batch, the tiles and switches that change no bit; on the GPU
within a unit of the three launches, and the prompt's forms bit for bit."""

from __future__ import annotations

import pytest
import torch
from test_hyper import STREAMS, close

from tfd.model.ops import linear
from tfd_kernels import hyper as hyper_kernels
from tfd_kernels import hyper_mix


def flash_next_read(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A read's inputs at Flash Next's sizes on the GPU (4 streams of 2,560, rank 320, injection rows, bf16):
    the down rows' product [rows, 324], the up weight [10240, 320] and the normalised streams."""
    g = torch.Generator().manual_seed(seed)
    projected = torch.randn(rows, 324, generator=g).bfloat16().cuda()
    up = (torch.randn(4 * 2560, 320, generator=g) * 320 ** -0.5).bfloat16().cuda()
    return projected, up, torch.randn(rows, 4 * 2560, generator=g).bfloat16().cuda()


def small_read(rows: int, seed: int, rank: int = 80, width: int = 72, streams: int = STREAMS,
               injects: bool = True, dtype: torch.dtype = torch.float32
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A read's inputs at the interpreter's sizes: the down rows' product [rows, rank (+ streams with
    ``injects``)], the up weight [streams * width, rank] and the normalised streams [rows, streams *
    width]."""
    g = torch.Generator().manual_seed(seed)
    projected = torch.randn(rows, rank + (streams if injects else 0), generator=g).to(dtype)
    up = (torch.randn(streams * width, rank, generator=g) * rank ** -0.5).to(dtype)
    return projected, up, torch.randn(rows, streams * width, generator=g).to(dtype)


@pytest.mark.parametrize("rows", [5, 16, 17, 64, 65])  # each side of the row tiles' bounds
@pytest.mark.parametrize("injects", [True, False])
def test_the_mix_in_one_launch_is_the_gates_the_up_product_and_the_mean(rows: int, injects: bool) -> None:
    """``mix`` against the three launches it replaces, in fp32 (the up product's sums in another order
    than the GEMM's: within fp32 rounding), with a rank past one K tile and not a multiple of it
    (RANK is 12; here 80) and a width past one column tile and not a multiple of it."""
    rank, width = 80, 72
    projected, up, normed = small_read(rows, 8, rank, width, injects=injects)
    got, got_weights = hyper_mix.mix(projected, up, normed, STREAMS, width)
    mixed, want_weights = hyper_kernels.gates(projected, rank, STREAMS)
    want = hyper_kernels.block_input(linear(mixed, up), normed, STREAMS, width)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    if injects:
        assert got_weights is not None and want_weights is not None and torch.equal(got_weights, want_weights)
    else:
        assert got_weights is None and want_weights is None
    alone = hyper_mix.mix(projected[3:4], up, normed[3:4], STREAMS, width)[0]
    assert torch.equal(alone[0], got[3])  # a row's bits alone as in a batch, whatever its tile


@pytest.mark.parametrize("rows", [1, 17])
# K tiles of 64: rank 80 is two (one or both early, or more asked for than there are), rank 200 four
@pytest.mark.parametrize(("rank", "early"), [(80, 1), (80, 2), (80, 5), (200, 3)])
def test_the_mix_asking_for_its_first_weights_early_changes_no_bits(rows: int, rank: int, early: int,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    projected, up, normed = small_read(rows, 10, rank)
    plain = hyper_mix.mix(projected, up, normed, STREAMS, 72)
    assert hyper_mix.MIX_K == 64
    monkeypatch.setattr(hyper_mix, "MIX_EARLY", early)
    early = hyper_mix.mix(projected, up, normed, STREAMS, 72)
    assert torch.equal(early[0], plain[0]) and early[1] is not None and plain[1] is not None
    assert torch.equal(early[1], plain[1])


def test_the_mix_rows_tried_cross_each_row_tile_bound() -> None:
    tiles = [hyper_mix.mix_tile(rows, 4) for rows in (16, 17, 64, 65)]
    apart = (hyper_mix.MIX_PROMPT_ROWS, hyper_mix.MIX_APART_COLUMNS)  # a prompt's tile, 4 streams apart
    assert tiles[0] != tiles[1] == tiles[2] != tiles[3] == apart
    # 8 streams: the one launch's prompt tile
    assert hyper_mix.mix_tile(65, 8) == (hyper_mix.MIX_PROMPT_ROWS, hyper_mix.MIX_PROMPT_COLUMNS)


@pytest.mark.parametrize("rows", [1, 16, 17])  # either side of the decode tiles' row bound
def test_a_decode_mixs_columns_change_no_bits(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    projected, up, normed = small_read(rows, 12)
    plain = hyper_mix.mix(projected, up, normed, STREAMS, 72)
    for columns in (8, 32):  # 9 and 3 column tiles of the 72 (16: 5)
        monkeypatch.setattr(hyper_mix, "MIX_COLUMNS", columns)
        assert hyper_mix.mix_tile(rows, STREAMS)[1] == columns
        got = hyper_mix.mix(projected, up, normed, STREAMS, 72)
        assert torch.equal(got[0], plain[0]) and got[1] is not None and plain[1] is not None
        assert torch.equal(got[1], plain[1])


@pytest.mark.parametrize("apart", [1, 0])  # the streams' products apart (the default), or the one launch
@pytest.mark.parametrize("rows", [65, 130])  # one prompt tile and a part, past the first of the other tiles
def test_a_prompt_mixs_tile_and_launch_change_no_bits(rows: int, apart: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hyper_mix, "MIX_PROMPT_APART", apart)
    projected, up, normed = small_read(rows, 11)
    plain = hyper_mix.mix(projected, up, normed, STREAMS, 72)
    for name, value in (("MIX_PROMPT_ROWS", 128), ("MIX_PROMPT_COLUMNS", 16), ("MIX_APART_COLUMNS", 16),
                        ("MIX_PROMPT_WARPS", 8), ("MIX_PROMPT_STAGES", 2)):
        monkeypatch.setattr(hyper_mix, name, value)
    other = hyper_mix.mix(projected, up, normed, STREAMS, 72)
    assert torch.equal(other[0], plain[0]) and other[1] is not None and plain[1] is not None
    assert torch.equal(other[1], plain[1])


@pytest.mark.parametrize("rows", [64, 65, 130])  # the last decode tile's rows, then a prompt's
def test_a_prompts_mix_may_run_as_the_three_launches(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    projected, up, normed = small_read(rows, 13)
    one = hyper_mix.mix(projected, up, normed, STREAMS, 72)
    products = []
    plain = hyper_mix.gemm.matmul
    monkeypatch.setattr(hyper_mix.gemm, "matmul", lambda *a, **k: products.append(1) or plain(*a, **k))
    monkeypatch.setattr(hyper_mix, "MIX_PROMPT_SPLIT", 1)
    got, got_weights = hyper_mix.mix(projected, up, normed, STREAMS, 72)
    if rows <= hyper_mix.MIX_TILES[-1][0]:  # decode rows: the one launch whatever the switch
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
    projected, up, normed = flash_next_read(rows, 14)
    one, one_weights = hyper_mix.mix(projected, up, normed, 4, 2560)
    monkeypatch.setattr(hyper_mix, "MIX_PROMPT_SPLIT", 1)
    got, got_weights = hyper_mix.mix(projected, up, normed, 4, 2560)
    assert torch.equal(got, one) and got_weights is not None and one_weights is not None
    assert torch.equal(got_weights, one_weights)
    for row in (0, rows - 1):  # a row alone runs a decode tile's one launch: its bits as in the prompt
        assert torch.equal(hyper_mix.mix(projected[row:row + 1], up, normed[row:row + 1], 4, 2560)[0][0],
                           got[row])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "streams", "injects"), [(64, 4, True), (65, 4, True), (130, 4, False),
                                                          (65, 2, True), (65, 8, True)])
def test_a_prompts_mix_with_the_streams_apart_has_the_one_launchs_bits(
        rows: int, streams: int, injects: bool, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """64 rows: a decode tile's launch either way; past them the prompt's, apart up to 4 streams (8: the
    one launch still). Rank 80 (two K tiles, the second part empty), width 72 (a column tile and a part)."""
    projected, up, normed = small_read(rows, 15, streams=streams, injects=injects, dtype=dtype)
    monkeypatch.setattr(hyper_mix, "MIX_PROMPT_APART", 0)
    one, one_weights = hyper_mix.mix(projected, up, normed, streams, 72)
    assert hyper_mix._up_described(up, 32) is None  # no tensor descriptor here: the pointer loads
    launched = []
    plain = hyper_mix._mix_apart.run
    monkeypatch.setattr(hyper_mix._mix_apart, "run", lambda *a, **k: launched.append(1) or plain(*a, **k))
    monkeypatch.setattr(hyper_mix, "MIX_PROMPT_APART", 1)
    got, got_weights = hyper_mix.mix(projected, up, normed, streams, 72)
    assert bool(launched) == (rows > hyper_mix.MIX_TILES[-1][0] and streams <= 4)
    assert torch.equal(got, one)
    if injects:
        assert got_weights is not None and one_weights is not None and torch.equal(got_weights, one_weights)
    else:
        assert got_weights is None and one_weights is None


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [65, 1024])
def test_on_the_gpu_a_prompts_mix_with_the_streams_apart_has_the_one_launchs_bits(
        rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    projected, up, normed = flash_next_read(rows, 16)
    monkeypatch.setattr(hyper_mix, "MIX_PROMPT_APART", 0)
    one, one_weights = hyper_mix.mix(projected, up, normed, 4, 2560)
    monkeypatch.setattr(hyper_mix, "MIX_PROMPT_APART", 1)
    # the same weights in rows 642 bytes apart: no tensor descriptor, the pointer loads
    unaligned = torch.empty(4 * 2560, 321, dtype=torch.bfloat16, device="cuda")[:, :320].copy_(up)
    assert hyper_mix._up_described(up, 32) is not None and hyper_mix._up_described(unaligned, 32) is None
    for columns, warps in ((64, 4), (32, 4), (32, 8), (64, 8), (16, 4)):  # the default first
        monkeypatch.setattr(hyper_mix, "MIX_APART_COLUMNS", columns)
        monkeypatch.setattr(hyper_mix, "MIX_PROMPT_WARPS", warps)
        for weight in (up, unaligned):
            got, got_weights = hyper_mix.mix(projected, weight, normed, 4, 2560)
            assert torch.equal(got, one), f"{columns} columns, {warps} warps, {weight.stride()}"
            assert got_weights is not None and one_weights is not None
            assert torch.equal(got_weights, one_weights)


def test_a_mix_of_streams_not_a_power_of_two_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="streams a power of 2"):
        hyper_mix.mix(torch.zeros(2, 12), torch.zeros(3 * 8, 12), torch.zeros(2, 3 * 8), 3, 8)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 16, 17, 64, 65, 100])  # each side of the row tiles' bounds
def test_on_the_gpu_the_mix_is_within_a_unit_and_a_rows_bits_stay_its_own(
        rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flash Next's sizes (4 streams of 2,560, rank 320, bf16): within a unit of the three launches'
    result, and each row's bits alone as in batches of either row tile."""
    projected, up, normed = flash_next_read(rows, 9)
    got, got_weights = hyper_mix.mix(projected, up, normed, 4, 2560)
    mixed, want_weights = hyper_kernels.gates(projected, 320, 4)
    want = hyper_kernels.block_input(linear(mixed, up), normed, 4, 2560)
    assert close(got, want, ulps=2) and got_weights is not None and want_weights is not None
    assert torch.equal(got_weights, want_weights)
    for row in {0, rows // 2, rows - 1}:
        assert torch.equal(hyper_mix.mix(projected[row:row + 1], up, normed[row:row + 1], 4, 2560)[0][0],
                           got[row])
    for early in (1, 5):  # the first of rank 320's five tiles of weights early, or all of them
        monkeypatch.setattr(hyper_mix, "MIX_EARLY", early)
        assert torch.equal(hyper_mix.mix(projected, up, normed, 4, 2560)[0], got)
    monkeypatch.setattr(hyper_mix, "MIX_EARLY", 0)
    for name, value in (("MIX_PROMPT_ROWS", 128), ("MIX_PROMPT_COLUMNS", 64), ("MIX_APART_COLUMNS", 32),
                        ("MIX_PROMPT_WARPS", 8)):
        monkeypatch.setattr(hyper_mix, name, value)  # a prompt's other tile: the same bits (a sweep's)
    for apart in (1, 0):  # the streams apart (the default), then the one launch
        monkeypatch.setattr(hyper_mix, "MIX_PROMPT_APART", apart)
        assert torch.equal(hyper_mix.mix(projected, up, normed, 4, 2560)[0], got)

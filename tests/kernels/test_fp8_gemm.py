"""The batch-invariant FP8 GEMM: ``tfd.model.fp8``'s bits for quantization, its math for products, and
rows that never depend on the batch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_gemm import conv_pool

from support import compiled_for_hopper
from tfd.model import fp8
from tfd_kernels import fp8_gemm, gemm, gemm_plan, runtime

E4M3_VALUES = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_weight(n: int, k: int, seed: int, device: str = "cpu") -> fp8.Fp8Weight:
    """A weight as a checkpoint holds it: normal values, quantized per 128x128 block."""
    w = fp8.quantize_weight(torch.randn(n, k, generator=generator(seed)) * 0.05)
    return fp8.Fp8Weight(w.data.to(device), w.scale_inv.to(device))


def random_rows(m: int, k: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Normal rows, each row's magnitude its own (10^-3 to 10^2: products stay finite in fp16)."""
    gen = generator(seed)
    magnitude = 10.0 ** (torch.rand(m, 1, generator=gen) * 5 - 3)
    return (torch.randn(m, k, generator=gen) * magnitude).to(dtype)


def exact_values(shape: tuple[int, int], groups: tuple[int, int], seed: int, powers: bool) -> torch.Tensor:
    """Integers in [-8, 8] with one +-448 in each ``groups``-sized block, each block times its own
    factor: 2^e (e in -1..1) with ``powers``, else any fp32 in [0.5, 2). The block's scale is then
    that factor (or within a rounding of it) and its e4m3 values are the integers (each quotient
    within a rounding of an integer that e4m3 holds, so rounded to it)."""
    gen = generator(seed)
    values = torch.randint(-8, 9, shape, generator=gen).float()
    rows, cols = shape
    for r in range(0, rows, groups[0]):
        for c in range(0, cols, groups[1]):
            height, width = min(groups[0], rows - r), min(groups[1], cols - c)
            at = int(torch.randint(0, height * width, (1,), generator=gen))
            values[r + at // width, c + at % width] = 448.0 if at % 2 else -448.0
            factor = 2.0 ** int(torch.randint(-1, 2, (1,), generator=gen)) if powers else \
                float(torch.rand(1, generator=gen)) * 1.5 + 0.5
            values[r:r + height, c:c + width] *= factor
    return values


def exact_inputs(m: int, n: int, k: int, seed: int,
                 powers: bool = True) -> tuple[torch.Tensor, fp8.Fp8Weight]:
    """Rows (one group all zeros where there are two rows) and a weight of integer e4m3 values, so
    every block's dot is an integer below 2^24 and exact in any order. With ``powers`` the factors
    are powers of two (2^-6 at least: x is scaled by 2^-4 so that fp16 holds the results), every
    partial sum a multiple of 2^-6 below 2^18 (checked): 24 bits hold it, so the sums are exact in
    any order too. Without, the factors and sums round: only the reference's order gives its bits."""
    x = exact_values((m, k), (1, fp8.BLOCK), seed, powers) / 16
    if m > 1:
        x[1, :fp8.BLOCK] = 0.0
    w = fp8.quantize_weight(exact_values((n, k), (fp8.BLOCK, fp8.BLOCK), seed + 1, powers))
    q, _ = fp8.quantize_rows(x)
    assert torch.equal(q.float().round(), q.float()) and torch.equal(w.data.float().round(), w.data.float())
    if powers:
        assert magnitudes(x, w).max() < 2 ** 18
    return x, w


def one_tile(n: int, k: int, tiles: gemm_plan.Tiles) -> gemm_plan.Plan:
    """The plan for an [n, k] weight with ``tiles`` in every form."""
    return gemm_plan.plan(n, k, spread=tiles, whole=tiles, few=tiles, mid=tiles, whole_one=tiles,
                          middle=tiles, narrow=tiles)


def product(x: torch.Tensor, w: fp8.Fp8Weight, spread: bool | None = None,
            choice: gemm_plan.Plan | None = None) -> torch.Tensor:
    got: torch.Tensor = fp8_gemm.matmul(x, w.data, w.scale_inv, spread=spread, choice=choice)
    return got


def magnitudes(x: torch.Tensor, w: fp8.Fp8Weight) -> torch.Tensor:
    """sum |q_x * x_scale * q_w * w_scale| over k per (row, column), in float64: what an fp32 sum of
    the terms in any order strays from the exact sum by at most gamma(additions) times."""
    q, scales = fp8.quantize_rows(x.cpu())
    rows = q.double().abs() * scales.double().repeat_interleave(fp8.BLOCK, 1)[:, :x.shape[1]]
    return rows @ w.dequantized(torch.float64).abs().cpu().T


def assert_quantized_alike(x: torch.Tensor) -> None:
    q, scales = fp8_gemm.quantize(x)
    want_q, want_scales = fp8.quantize_rows(x.cpu())
    assert torch.equal(q.cpu().view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(scales.cpu(), want_scales)


def quantize_cases(dtype: torch.dtype) -> torch.Tensor:
    """Rows of 200 (a partial last group): ordinary rows, an all-zero group, a group of fp32 values so
    tiny that max / 448 underflows to 0 (scale 1, q 0) and one whose scale is subnormal, a group whose
    max lands one rounding above 448, and a group of scale 1 holding every e4m3 value, every midpoint
    between two (ties to even) and their fp32 neighbours, -0 included."""
    x = random_rows(8, 200, seed=1)
    x[1, :128] = 0.0
    x[2, 128:] = 0.0  # the partial group alone all zeros
    grid = torch.unique(E4M3_VALUES[E4M3_VALUES.abs() <= 448])
    middles = (grid[1:] + grid[:-1]) / 2
    ties = torch.cat([grid, middles, middles.nextafter(middles + 1), middles.nextafter(middles - 1),
                      torch.tensor([-0.0, 1e-30, -1e-30])])
    rows = [torch.cat([torch.tensor([448.0]), ties[i:i + 127]]) for i in range(0, len(ties), 127)]
    ties = torch.nn.functional.pad(torch.stack([torch.nn.functional.pad(r, (0, 128 - len(r))) for r in rows]),
                                   (0, 72))
    if dtype == torch.float32:
        x[3, :128] = torch.linspace(-1, 1, 128) * 1e-44
        x[4, :128] = torch.linspace(-1, 1, 128) * 1e-40
        # a max whose quotient by max / 448 rounds above 448: the clamp brings it back
        above = next(v for v in torch.linspace(1, 2, 4097)
                     if (v.float() / (v.float() / 448.0)).item() > 448.0)
        x[5, :128] = torch.linspace(-1, 1, 128)
        x[5, 64] = above
        assert (x[5, :128].abs().max() / (x[5, :128].abs().max() / 448.0)).item() > 448.0
        return torch.cat([x, ties])
    return torch.cat([x, ties]).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_gives_the_references_bits(dtype: torch.dtype) -> None:
    assert_quantized_alike(quantize_cases(dtype))


def test_quantize_takes_rows_of_any_count_and_a_stride() -> None:
    x = random_rows(40, 300, seed=2)  # two programs of rows, three groups, the last partial
    assert_quantized_alike(x)
    assert_quantized_alike(x[:, :256])  # rows strided past their length
    q, scales = fp8_gemm.quantize(x[:0])
    assert q.shape == (0, 300) and scales.shape == (0, 3)


@pytest.mark.parametrize(("m", "n", "k", "segments"), [
    (3, 128, 128, 1),  # whole blocks both ways
    (3, 130, 129, 1),  # a 2-row out block, a 1-wide K block
    (4, 64, 200, 1),  # out under a block, in over one
    (3, 130, 640, 1),  # five blocks, one segment
    (2, 128, 1024, 2),  # two segments of four blocks
    (5, 200, 1100, 2),  # two segments, the last partial block in the second
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_exact_products_equal_the_reference(m: int, n: int, k: int, segments: int,
                                            dtype: torch.dtype) -> None:
    # Exact dots: with one segment the factors (scales multiplied first) and the chain of block sums
    # are the reference's, so its bits whatever the scales; with several, power-of-two scales keep
    # every sum exact, so the segments' association cannot show and the bits are its too.
    assert fp8_gemm.default_plan(n, k).segments == segments
    for powers in (True, False) if segments == 1 else (True,):
        x, w = exact_inputs(m, n, k, seed=m + n + k, powers=powers)
        x = x.to(dtype)
        want = fp8.linear(x, w)
        for spread in (True, False):
            assert torch.equal(product(x, w, spread=spread), want), f"powers={powers}, spread={spread}"


@pytest.mark.parametrize(("m", "n", "k"), [(3, 130, 200), (6, 96, 1100), (2, 64, 2048)])
def test_products_of_random_rows_are_within_fp32_rounding_of_the_reference(m: int, n: int, k: int) -> None:
    # Both sum the same exact e4m3 products and multiply by the same factors; they may differ in the
    # order of a block's 128 additions (numpy's dot against torch's) and of the blocks' (segments),
    # so each is within gamma(128 + blocks) * sum |terms| of the exact sum: twice that apart at most.
    w = random_weight(n, k, seed=n)
    steps = 128 + fp8.blocks(k)
    for dtype, bits in ((torch.float32, 23), (torch.bfloat16, 7), (torch.float16, 10)):
        x = random_rows(m, k, seed=k, dtype=dtype)
        got, want = product(x, w).double(), fp8.linear(x, w).double()
        # then each rounded once to x's dtype: one unit of its last place apart at most
        ulp = 2.0 ** (want.abs().clamp(min=2 ** -14).log2().floor() - bits) if bits < 23 else 0.0
        assert ((got - want).abs() <= 2 * steps * 2.0 ** -24 * magnitudes(x, w) + ulp).all()


def test_the_plan_follows_the_weight_alone_in_whole_blocks() -> None:
    for n, k in ((130, 1100), (4096, 4096), (4096, 12288), (248320, 4096)):
        choice = fp8_gemm.default_plan(n, k)
        assert choice.k_per_segment % fp8.BLOCK == 0 and (choice.segments - 1) * choice.k_per_segment < k
        tiles = {choice.spread_tiles(m) for m in (1, 64, 65, 128)} | {choice.whole_tiles(1)}
        assert {t.block_k for t in tiles} == {fp8.BLOCK} and all(t.block_m % 64 == 0 for t in tiles)
    # about one program a multiprocessor (TARGET) where K has the steps: 64 column tiles take 3 segments
    # (bf16's plan: 5), 2 tiles as many as K's 4-step segments allow, 3,880 tiles one
    assert [fp8_gemm.default_plan(n, k).segments for n, k in ((4096, 12288), (128, 1024), (248320, 4096))] \
        == [3, 2, 1]
    assert gemm_plan.plan(4096, 12288).segments == 5


@pytest.mark.parametrize(("n", "k"), [(130, 1100), (64, 300)])  # two segments, then one
def test_a_row_alone_equals_the_row_in_batches_in_both_forms(n: int, k: int) -> None:
    x = random_rows(130, k, seed=n)
    w = random_weight(n, k, seed=k)
    choice = fp8_gemm.default_plan(n, k)
    # the defaults: the spread form up to 128 rows (a taller tile from 65), the whole form from 129
    assert [choice.spreads(m, n, 1) for m in (1, 64, 65, 128, 129)] == [True] * 4 + [False]
    assert choice.spread_tiles(64) == fp8_gemm.SPREAD and choice.spread_tiles(65) == fp8_gemm.MIDDLE
    alone = torch.stack([product(x[row:row + 1], w)[0] for row in (0, 5, 63, 64, 129)])
    for spread in (None, True, False):
        for m in (2, 7, 64, 65, 128, 129, 130):
            rows = [row for row in (0, 5, 63, 64, 129) if row < m]
            batch = product(x[:m], w, spread=spread)
            assert torch.equal(batch[rows], alone[:len(rows)]), f"rows differ at m={m}, spread={spread}"


def test_narrower_few_row_tiles_take_fewer_segments_and_keep_a_rows_bits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # SPREAD_N (a tfd bench --variant switch): 32-column few-row tiles make twice the column tiles, so
    # TARGET 128 leaves a [4,096, 4,096] product one segment (64 columns: two; 32 at TARGET 132: two)
    monkeypatch.setattr(fp8_gemm, "TARGET", 128)
    assert fp8_gemm.default_plan(4096, 4096).segments == 2
    monkeypatch.setattr(fp8_gemm, "SPREAD_N", 32)
    choice = fp8_gemm.default_plan(4096, 4096)
    assert choice.segments == 1 and choice.spread_tiles(1).block_n == 32
    assert choice.spread_tiles(65) == fp8_gemm.MIDDLE and choice.whole_tiles(1) == fp8_gemm.WHOLE
    monkeypatch.setattr(fp8_gemm, "TARGET", 132)
    assert fp8_gemm.default_plan(4096, 4096).segments == 2
    x = random_rows(70, 1100, seed=8)
    w = random_weight(130, 1100, seed=9)
    alone = torch.stack([product(x[row:row + 1], w)[0] for row in (0, 33, 69)])
    for m in (34, 70):
        rows = [row for row in (0, 33, 69) if row < m]
        assert torch.equal(product(x[:m], w)[rows], alone[:len(rows)]), m


@pytest.mark.parametrize(("k", "one_segment"), [(1100, False), (256, True)])
def test_both_launch_forms_give_the_same_bits(k: int, one_segment: bool) -> None:
    x = random_rows(20, k, seed=k)
    w = random_weight(200, k, seed=3)
    for choice in (fp8_gemm.default_plan(200, k), one_tile(200, k, fp8_gemm.SPREAD)):
        assert (choice.segments == 1) == one_segment
        spread, whole = product(x, w, spread=True, choice=choice), product(x, w, spread=False, choice=choice)
        assert torch.equal(spread, whole)
    # every tile's last program rearmed its arrival counter, so the next product starts from zero
    assert not runtime.counters("fp8_gemm.spread", fp8_gemm.COUNTERS, x.device).any()


class Launches:
    """``fp8_gemm._spread`` recording whether each launch ran swapped, then launching it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.kernel, self.swapped = fp8_gemm._spread, list[bool]()
        monkeypatch.setattr(fp8_gemm, "_spread", self)

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., object]:
        def launch(*args: object, **kwargs: object) -> object:
            self.swapped.append(bool(kwargs.get("SWAP", False)))
            return self.kernel[grid](*args, **kwargs)
        return launch


def swapped_and_not(monkeypatch: pytest.MonkeyPatch, make: Callable[[], torch.Tensor],
                    launches: Launches, swaps: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``make()`` with SWAP_ROWS 16 (its launch swapped if ``swaps``, checked), then with 0 (never)."""
    monkeypatch.setattr(fp8_gemm, "SWAP_ROWS", 16)
    launches.swapped.clear()
    swapped = make()
    assert launches.swapped == [swaps]
    monkeypatch.setattr(fp8_gemm, "SWAP_ROWS", 0)
    plain = make()
    assert launches.swapped == [swaps, False]
    return swapped, plain


# 130 columns (not whole 64-column tiles) by K 200 (a partial second block): one segment; 200 x 1100 two,
# 70 x 1500 three (each tile's last program sums the others' partials)
@pytest.mark.parametrize(("n", "k", "segments"), [(130, 200, 1), (200, 1100, 2), (70, 1500, 3)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_swapped_form_gives_the_unswapped_bits(n: int, k: int, segments: int, dtype: torch.dtype,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Exact dots (the interpreter's): the same products, factors and order of additions, so the same bits
    # where the factors round too (powers False); with power-of-two factors, the reference's bits as well.
    # Up to 16 rows swapped, 17 the unswapped form either way (both sides of SWAP_ROWS).
    assert fp8_gemm.default_plan(n, k).segments == segments
    launches = Launches(monkeypatch)
    for m in (1, 5, 16, 17):
        for powers in (True, False):
            x, w = exact_inputs(m, n, k, seed=m + n + k, powers=powers)
            x = x.to(dtype)
            swapped, plain = swapped_and_not(monkeypatch, lambda x=x, w=w: product(x, w), launches, m <= 16)
            assert torch.equal(swapped, plain), f"m={m}, powers={powers}"
            if powers:
                assert torch.equal(swapped, fp8.linear(x, w)), f"m={m}"


def test_a_row_alone_equals_the_row_in_batches_across_the_swapped_forms_rows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # rows 1 to 16 swapped, 17 on not: a row's bits the same either side (exact dots, rounding factors)
    monkeypatch.setattr(fp8_gemm, "SWAP_ROWS", 16)
    launches = Launches(monkeypatch)
    x, w = exact_inputs(20, 130, 1100, seed=4, powers=False)
    rows = (0, 5, 15, 16, 19)
    alone = torch.stack([product(x[row:row + 1], w)[0] for row in rows])
    assert launches.swapped == [True] * len(rows)
    for m in (2, 7, 16, 17, 20):
        launches.swapped.clear()
        batch = product(x[:m], w)
        assert launches.swapped == [m <= 16]
        kept = [i for i, row in enumerate(rows) if row < m]
        assert torch.equal(batch[[rows[i] for i in kept]], alone[kept]), f"rows differ at m={m}"
    # SWAP_ROWS is read at each launch, and never swaps more than a 16-row tile
    monkeypatch.setattr(fp8_gemm, "SWAP_ROWS", 5)
    launches.swapped.clear()
    for m in (5, 6):
        product(x[:m], w)
    monkeypatch.setattr(fp8_gemm, "SWAP_ROWS", 64)
    product(x[:17], w)
    assert launches.swapped == [True, False, False]


@pytest.mark.parametrize(("channels", "k"), [(128, 256), (128, 2048)])  # one K segment, several
@pytest.mark.parametrize("m", [1, 3])
def test_the_swapped_form_applies_the_conv_as_it_stores(channels: int, k: int, m: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # The tile transposed back to [rows, cols] before the sum of segments and the epilogue: the conv's
    # bits and tails moved as the unswapped form's (its whole 64-column tiles), nothing run after
    n, width = 192, 4
    assert fp8_gemm.takes_conv(gemm.Conv(torch.empty(channels, width), torch.empty(1), torch.empty(1)), n,
                               fp8_gemm.swapped_tiles())
    monkeypatch.setattr(fp8_gemm, "conv_after", lambda *_: pytest.fail("the conv ran after the product"))
    launches = Launches(monkeypatch)
    x, w = exact_inputs(m, n, k, seed=m + k, powers=False)
    x = (x * 2.0 ** -12).to(torch.bfloat16)  # the same bits scaled: sums of about 10 at most, in SiLU's range
    q, scales = fp8_gemm.quantize(x)
    conv_weight = (torch.randn(channels, width, generator=generator(1)) / 2).to(torch.bfloat16)
    first, tail_at = conv_pool(m, channels, width, torch.bfloat16)
    pools = [first.clone(), first.clone()]  # the swapped launch's, then the unswapped one's
    given = iter(pools)

    def projected() -> torch.Tensor:
        got: torch.Tensor = fp8_gemm.product(q, scales, w.data, w.scale_inv, x.dtype,
                                             conv=gemm.Conv(conv_weight, next(given), tail_at))
        return got

    swapped, plain = swapped_and_not(monkeypatch, projected, launches, True)
    assert torch.equal(swapped, plain) and swapped[:, :channels].any()
    assert torch.equal(pools[0], pools[1]) and not torch.equal(pools[0], first)  # the tails moved alike


def test_strided_rows_give_the_contiguous_bits() -> None:
    wide = random_rows(5, 300, seed=9)
    w = random_weight(70, 200, seed=9)
    want = product(wide[:, :200].contiguous(), w)
    assert torch.equal(product(wide[:, :200], w), want)  # rows 300 apart
    assert torch.equal(product(wide[:, :200].T.contiguous().T, w), want)  # along k not contiguous: copied


def test_no_rows_give_no_rows() -> None:
    w = random_weight(130, 200, seed=1)
    for spread in (None, True, False):
        got = product(torch.zeros(0, 200, dtype=torch.bfloat16), w, spread=spread)
        assert got.shape == (0, 130) and got.dtype == torch.bfloat16


def test_arguments_are_checked_by_name() -> None:
    w = random_weight(130, 200, seed=1)
    x = torch.zeros(2, 200)
    cases = [
        ((x.double(), w.data, w.scale_inv), "x must be bfloat16"),
        ((x[0], w.data, w.scale_inv), "x must be 2-D"),
        ((x, w.data.float(), w.scale_inv), r"data \(weight\) must be torch.float8_e4m3fn"),
        ((x, w.data[:, :100], w.scale_inv), r"data .* \[out, 200\]"),
        ((x[:, :199], w.data, w.scale_inv), r"data .* \[out, 199\]"),
        ((x, torch.empty(200, 130, dtype=torch.float8_e4m3fn).T, w.scale_inv), "data .* contiguous along in"),
        ((x, w.data, w.scale_inv.double()), r"scale_inv \(weight_scale_inv\) must be torch.float32"),
        ((x, w.data, w.scale_inv[:1]), r"scale_inv .* shape \(2, 2\)"),
        ((x[:, :0], w.data[:, :0], w.scale_inv[:, :0]), r"data .* at least 1"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            fp8_gemm.matmul(*args)
    with pytest.raises(ValueError, match="choice must take K steps"):
        fp8_gemm.matmul(x, w.data, w.scale_inv, choice=gemm_plan.plan(130, 200))  # 64-wide K steps
    with pytest.raises(ValueError, match="x must be bfloat16"):
        fp8_gemm.quantize(x.int())
    with pytest.raises(ValueError, match="x must be 2-D"):
        fp8_gemm.quantize(x[0])


# Compiles the kernels for sm_90 as matmul launches them (bf16 rows; shapes divisible by 16, as Triton
# specializes them) and prints, for each, how often each PTX instruction that carries the numerics
# appears, or its error.
HOPPER_SCRIPT = r"""
import json, re, sys
from triton.compiler import ASTSource
from hopper_ptx import counted, signature
from tfd_kernels import fp8_gemm as f

ALIGNED = {"n", "k", "stride_xm", "stride_wn", "stride_om", "stride_pm", "k_per_segment", "stride_qm"}
FOUND = re.compile(r"\b(wgmma\.mma_async\S+|mma\.sync\S+|div\.[\w.]*f32|fma\.rn\.f32"
                   r"|cvt\.rn\.satfinite\.e4m3x2\.f32|cp\.async\.cg\.shared\.global)")
POINTERS = dict(w="*fp8e4nv", w_scales="*fp32", x_scales="*fp32", partials="*fp32", out="*bf16",
                counters="*i32", q="*fp8e4nv", scales="*fp32", conv_weight="*bf16", tails="*bf16",
                tail_at="*i64")
PRODUCTS = {"spread", "spread.n32", "middle", "whole", "spread.conv", "swapped", "swapped.one",
            "swapped.conv"}  # e4m3 rows, which quantize makes
PLAIN = dict(CONV=False, WIDTH=2)
N32 = type(f.SPREAD)(f.SPREAD.block_m, 32, f.SPREAD.block_k, f.SPREAD.warps, f.SPREAD.stages)  # SPREAD_N 32
SWAPPED = dict(SWAP=True)
CASES = {"spread": (f._spread, f.SPREAD, dict(SEGMENTS=2, **PLAIN)),
         "spread.n32": (f._spread, N32, dict(SEGMENTS=1, **PLAIN)),
         "middle": (f._spread, f.MIDDLE, dict(SEGMENTS=1, **PLAIN)),
         "spread.conv": (f._spread, f.SPREAD, dict(SEGMENTS=2, CONV=True, WIDTH=4)),
         "whole": (f._whole, f.WHOLE, dict(ONE_SEGMENT=False, GROUP=f.GROUP_M)),
         "swapped": (f._spread, f.swapped_tiles(), dict(SEGMENTS=2, **PLAIN, **SWAPPED)),
         "swapped.one": (f._spread, f.swapped_tiles(), dict(SEGMENTS=1, **PLAIN, **SWAPPED)),
         "swapped.conv": (f._spread, f.swapped_tiles(), dict(SEGMENTS=2, CONV=True, WIDTH=4, **SWAPPED)),
         "quantize": (f._quantize, None, dict(BLOCK_M=f.QUANTIZE_ROWS))}
result = {}
for name, (fn, tiles, constexprs) in CASES.items():
    constexprs = {**constexprs, "BLOCK_K": f.BLOCK, "EXACT_CAST": False, "PDL": True}
    if "SWAP" in fn.arg_names:  # a constexpr with a default: given here, or signature would type it i32
        constexprs.setdefault("SWAP", False)
    options = dict(f.OPTIONS)
    if tiles is not None:
        constexprs.update(BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n)
        options.update(num_warps=tiles.warps, num_stages=tiles.stages)
    pointers = {arg: kind for arg, kind in POINTERS.items() if arg in fn.arg_names}
    if "x" in fn.arg_names:
        pointers["x"] = "*fp8e4nv" if name in PRODUCTS else "*bf16"
    aligned = {*pointers, *ALIGNED}
    attrs = {(i,): [["tt.divisibility", 16]] for i, arg in enumerate(fn.arg_names) if arg in aligned}
    source = ASTSource(fn=fn, signature=signature(fn, pointers, constexprs, {}), constexprs=constexprs,
                       attrs=attrs)
    result[name] = counted(source, options, FOUND)
json.dump(result, sys.stdout)
"""


PRODUCTS = {"spread", "spread.n32", "middle", "whole", "spread.conv", "swapped", "swapped.one",
            "swapped.conv"}  # as HOPPER_SCRIPT's
CONVS = {"spread.conv": 128, "swapped.conv": 32}  # the epilogue's fused multiply-adds: 4 taps an element


def test_the_kernels_compile_for_hopper_with_the_numerics_they_claim(tmp_path: Path) -> None:
    # The interpreter compiles nothing: this is where a kernel that cannot build for the device shows,
    # and where the device's numerics are read: every product a warp group's fp8 wgmma (the same
    # instructions for every tile) and no division; the quantization's correctly rounded divisions
    # (never div.full) and the hardware's round-to-nearest e4m3 conversion; nowhere a fused
    # multiply-add (a product rounds before its add) but the GDN conv's taps in the projection's epilogue,
    # explicit there as conv1d's contracted ones are. The weights and rows reach shared memory by cp.async:
    # Triton's pipeline of the K loop holds. The swapped form's wgmma is m64n16: the weight tile the M side,
    # its 16 rows the N side, with the same e4m3 operands as the unswapped m64n64's.
    compiled = compiled_for_hopper(["-c", HOPPER_SCRIPT], tmp_path, [Path(__file__).parent])
    assert not [case for case in compiled.values() if "error" in case], compiled
    for name, found in compiled.items():
        products = {op for op in found if "mma" in op}
        if name in PRODUCTS:  # wgmma.mma_async...e4m3.e4m3 alone, never mma.sync, and nothing divided
            assert products, found
            assert all(op.startswith("wgmma") and op.endswith("e4m3.e4m3") for op in products), found
            # but the conv's SiLU, a division as conv1d's own (div.full.f32 in both)
            divisions = {op for op in found if op.startswith("div.")}
            assert divisions == ({"div.full.f32"} if name in CONVS else set()), (name, found)
            assert found.get("cp.async.cg.shared.global"), (name, found)
            if name.startswith("swapped"):
                assert products == {"wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3"}, (name, found)
        else:
            assert found.get("div.rn.f32") and found.get("cvt.rn.satfinite.e4m3x2.f32"), (name, found)
            assert not [op for op in found if op.startswith("div.") and op != "div.rn.f32"], (name, found)
        # a 64 x 64 tile over 128 threads: 32 elements a thread, four taps each (16 x 64: 8 elements)
        assert found.get("fma.rn.f32", 0) == CONVS.get(name, 0), (name, found)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_gives_the_references_bits_on_the_device(dtype: torch.dtype) -> None:
    assert_quantized_alike(quantize_cases(dtype).cuda())
    assert_quantized_alike(random_rows(300, 4096 + 72, seed=4, dtype=dtype).cuda())


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(4096, 4096), (1000, 2200), (24576, 512)])  # 5, 4 and 1 segments
def test_products_are_near_the_reference_on_the_device(n: int, k: int) -> None:
    # Hopper's fp8 wgmma adds a block's products at reduced precision (about 14 bits kept), so the
    # bound is 2^-10 of the terms' magnitudes, plus the bf16 result's rounding (one unit either side).
    x = random_rows(8, k, seed=5, dtype=torch.bfloat16)
    w = random_weight(n, k, seed=6)
    want = fp8.linear(x, w).double()
    got = fp8_gemm.matmul(x.cuda(), w.data.cuda(), w.scale_inv.cuda()).cpu().double()
    assert ((got - want).abs() <= 2.0 ** -10 * magnitudes(x, w) + 2.0 ** -7 * want.abs()).all()


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(4096, 4096), (1000, 2200), (24576, 512)])
@pytest.mark.parametrize("swap_rows", [0, 16])  # 16: rows 1 to 16 in the swapped form
def test_rows_are_batch_invariant_on_the_device(n: int, k: int, swap_rows: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fp8_gemm, "SWAP_ROWS", swap_rows)
    w = random_weight(n, k, seed=7, device="cuda")
    x = torch.randn(300, k, device="cuda", dtype=torch.bfloat16)
    whole = fp8_gemm.matmul(x, w.data, w.scale_inv)
    for m in range(1, 301):
        for spread in (None, True, False):
            got = fp8_gemm.matmul(x[:m], w.data, w.scale_inv, spread=spread)
            assert torch.equal(got, whole[:m]), f"rows differ at m={m}, spread={spread}"


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(4096, 4096), (4096, 12288), (12352, 4096)])  # the 9B's products
def test_the_swapped_form_gives_the_unswapped_bits_on_the_device(n: int, k: int,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Random rows and weights: each block's dot is the tensor cores' (m64n16k32 against m64n64k32, the
    # operands' roles swapped), so this is where the swapped form's bits are shown to be the same (or not).
    # fp32 out too, where no rounding to bf16 could hide a difference.
    w = random_weight(n, k, seed=n + k, device="cuda")
    x = random_rows(16, k, seed=k, dtype=torch.bfloat16).cuda()
    for m in (1, 16):
        q, scales = fp8_gemm.quantize(x[:m])
        for dtype in (torch.float32, torch.bfloat16):
            got = []
            for swap_rows in (16, 0):
                monkeypatch.setattr(fp8_gemm, "SWAP_ROWS", swap_rows)
                got.append(fp8_gemm.product(q, scales, w.data, w.scale_inv, dtype))
            assert torch.equal(got[0], got[1]), f"m={m}, {dtype}: {(got[0] != got[1]).sum()} differ"

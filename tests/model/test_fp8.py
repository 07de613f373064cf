"""Block-wise FP8 (tfd.model.fp8): the weight round trip, per-row activation quantization, and the
product against an fp64 computation of the same math, against the unquantized product, and row by
row whatever the batch.

Bounds come from e4m3's precision: 3 mantissa bits, so rounding to nearest moves a normal value by at
most half a unit in the last place, 2^-4 of its magnitude; below the smallest normal (2^-6) the
spacing is 2^-9, so at most 2^-10 in q's units, i.e. 2^-10 * scale once scaled back.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_models
import torch

from tfd.model import ops
from tfd.model.fp8 import (
    BLOCK,
    E4M3_MAX,
    Fp8Weight,
    Joined,
    Rows,
    join,
    linear,
    quantize_rows,
    quantize_weight,
)

# Both sides of each block boundary (and a single element), on out and on in.
SIZES = [1, 128, 129, 256, 257]
SHAPES = [(out, inp) for out in SIZES for inp in SIZES]
BLOCKS = {1: 1, 128: 1, 129: 2, 256: 2, 257: 3}
RELATIVE = 2.0**-4  # half an e4m3 ulp relative to a normal value
SUBNORMAL = 2.0**-10  # half e4m3's subnormal spacing, in q's units
# The fp32 roundings around e4m3's (the division by the scale, the product with it): a few 2^-24.
FP32_SLACK = 2.0**-20


def weight(out: int, inp: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    """Random [out, in] whose 128x128 blocks span six decades of magnitude: each block's scale matters."""
    generator = torch.Generator().manual_seed(seed)
    magnitudes = 10.0 ** torch.empty(BLOCKS[out], BLOCKS[inp]).uniform_(-3, 3, generator=generator)
    spread = magnitudes.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:out, :inp]
    return (torch.randn(out, inp, generator=generator) * spread).to(dtype)


def activations(rows: int, inp: int, dtype: torch.dtype = torch.float32, seed: int = 1) -> torch.Tensor:
    """Random [rows, in] with a magnitude per (row, group) across four decades."""
    generator = torch.Generator().manual_seed(seed)
    magnitudes = 10.0 ** torch.empty(rows, BLOCKS[inp]).uniform_(-2, 2, generator=generator)
    spread = magnitudes.repeat_interleave(BLOCK, 1)[:, :inp]
    return (torch.randn(rows, inp, generator=generator) * spread).to(dtype)


def expanded(scale: torch.Tensor, shape: tuple[int, int], rows_blocked: bool) -> torch.Tensor:
    """One scale per element: of [out, in] (``rows_blocked``: blocks both ways) or [rows, in] (groups)."""
    if rows_blocked:
        scale = scale.repeat_interleave(BLOCK, 0)
    return scale.repeat_interleave(BLOCK, 1)[: shape[0], : shape[1]].double()


def block_amax(values: torch.Tensor) -> torch.Tensor:
    """max |v| of each 128x128 block of [out, in], spread back to [out, in]."""
    out, inp = values.shape
    padded = torch.zeros(BLOCKS[out] * BLOCK, BLOCKS[inp] * BLOCK, dtype=torch.float64)
    padded[:out, :inp] = values.double().abs()
    amax = padded.view(BLOCKS[out], BLOCK, BLOCKS[inp], BLOCK).amax(dim=(1, 3))
    return expanded(amax, (out, inp), rows_blocked=True)


def exact_product(x: torch.Tensor, w: Fp8Weight) -> tuple[torch.Tensor, torch.Tensor]:
    """The quantized math in fp64, straightforwardly: (x's quantized values) @ (w's real values).T,
    and the same with every term's magnitude (the scale of fp32's rounding of that sum)."""
    q, scales = quantize_rows(x)
    x_real = q.double() * expanded(scales, tuple(x.shape), rows_blocked=False)
    w_real = w.data.double() * expanded(w.scale_inv, w.shape, rows_blocked=True)
    return x_real @ w_real.T, x_real.abs() @ w_real.abs().T


@pytest.mark.parametrize(("out", "inp"), SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_round_trip_within_e4m3_precision(out: int, inp: int, dtype: torch.dtype) -> None:
    w = weight(out, inp, dtype)
    fp8 = quantize_weight(w)
    assert fp8.shape == (out, inp)
    assert fp8.data.dtype == torch.float8_e4m3fn and fp8.scale_inv.dtype == torch.float32
    assert tuple(fp8.scale_inv.shape) == (BLOCKS[out], BLOCKS[inp])
    real = w.double()
    error = (fp8.dequantized().double() - real).abs()
    # Per element: half an e4m3 ulp of w (2^-4 |w|), or half the subnormal spacing times the scale.
    scale = expanded(fp8.scale_inv, (out, inp), rows_blocked=True)
    assert bool((error <= (RELATIVE + FP32_SLACK) * real.abs() + SUBNORMAL * scale).all())
    # Hence relative to each block's max: every |w| is at most that max, the subnormal term far smaller.
    assert bool((error <= (RELATIVE + FP32_SLACK) * block_amax(w)).all())
    # The scale maps each block's max onto e4m3's largest value.
    assert torch.equal(block_amax(fp8.data.float()), torch.full((out, inp), E4M3_MAX, dtype=torch.float64))
    assert fp8.dequantized(torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize(("out", "inp"), [(128, 128), (129, 257), (257, 129), (256, 256)])
def test_zero_blocks_stay_zero_and_finite(out: int, inp: int) -> None:
    w = weight(out, inp)
    w[:128, :128] = 0  # a whole block
    w[128:, 128:] = 0  # the last blocks, partial where out or in is past a multiple of 128
    fp8 = quantize_weight(w)
    real = fp8.dequantized()
    assert bool(torch.isfinite(fp8.data.float()).all() and torch.isfinite(real).all())
    assert bool((real[:128, :128] == 0).all() and (real[128:, 128:] == 0).all())
    assert fp8.scale_inv[0, 0] == 1.0
    assert torch.equal(quantize_weight(torch.zeros(out, inp)).dequantized(), torch.zeros(out, inp))


@pytest.mark.parametrize("inp", SIZES)
@pytest.mark.parametrize("rows", [1, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_rows(inp: int, rows: int, dtype: torch.dtype) -> None:
    x = activations(rows, inp, dtype)
    x[-1, :BLOCK] = 0  # an all-zero group (the whole row where in <= 128)
    q, scales = quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (rows, inp)
    assert scales.dtype == torch.float32 and scales.shape == (rows, BLOCKS[inp])
    # Each group's largest |q| is 448, or 0 for the zero group.
    padded = torch.zeros(rows, BLOCKS[inp] * BLOCK)
    padded[:, :inp] = q.float().abs()
    group_max = padded.view(rows, BLOCKS[inp], BLOCK).amax(dim=2)
    expected = torch.full_like(group_max, E4M3_MAX)
    expected[-1, 0] = 0
    assert torch.equal(group_max, expected)
    assert bool(torch.isfinite(scales).all())
    # q * scale gives x back within e4m3's precision (the bound in this file's docstring).
    per_element = expanded(scales, (rows, inp), rows_blocked=False)
    error = (q.double() * per_element - x.double()).abs()
    assert bool((error <= (RELATIVE + FP32_SLACK) * x.double().abs() + SUBNORMAL * per_element).all())


@pytest.mark.parametrize(("out", "inp"), SHAPES)
@pytest.mark.parametrize("rows", [1, 6])
def test_linear_matches_fp64_of_the_same_math(out: int, inp: int, rows: int) -> None:
    w = quantize_weight(weight(out, inp))
    x = activations(rows, inp)
    result = linear(x, w)
    assert result.dtype == torch.float32 and result.shape == (rows, out)
    exact, magnitude = exact_product(x, w)
    # fp32's ordered sums: within a 128-term block (exact e4m3 products), two roundings for the scales,
    # up to two more additions over K blocks; ~131 roundings of 2^-24 each, under 2^-16 of the sum of
    # the terms' magnitudes.
    assert bool(((result.double() - exact).abs() <= 2.0**-16 * magnitude).all())


@pytest.mark.parametrize(("out", "inp"), SHAPES)
def test_linear_close_to_the_unquantized_product(out: int, inp: int) -> None:
    w = quantize_weight(weight(out, inp))
    x = activations(6, inp)
    w_real = w.dequantized().double()
    reference = x.double() @ w_real.T
    error = (linear(x, w).double() - reference).abs()
    # Only the activations' quantization separates the two: each x_i moves by at most 2^-4 |x_i| +
    # 2^-10 * its group's scale (the round-trip bound), weighted by |w_i|; fp32's sums (2^-16 of the
    # quantized terms' magnitudes, as above, under 2^-15 of the unquantized ones) add a sliver.
    _, scales = quantize_rows(x)
    x_scale = expanded(scales, tuple(x.shape), rows_blocked=False)
    magnitude = x.double().abs() @ w_real.abs().T
    assert bool((error <= (RELATIVE + 2.0**-15) * magnitude + SUBNORMAL * (x_scale @ w_real.abs().T)).all())
    # What a user sees, typically: each output's error over its terms' root-sum-square is about the rms
    # relative rounding error of an e4m3 element, ~2.6% (at most 2^-4, mostly less); 4% leaves a margin.
    root_sum_square = ((x.double() ** 2) @ (w_real**2).T).sqrt()
    assert float((error / root_sum_square).pow(2).mean().sqrt()) < 0.04


@pytest.mark.parametrize(("out", "inp"), [(128, 128), (129, 129), (256, 257), (257, 256), (257, 257)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_row_invariant(out: int, inp: int, dtype: torch.dtype) -> None:
    w = quantize_weight(weight(out, inp, torch.bfloat16))
    rows = activations(5, inp, dtype)
    others = activations(5, inp, dtype, seed=2) * 10
    for r in range(5):
        alone = linear(rows[r : r + 1], w)
        batch = others.clone()
        batch[r] = rows[r]  # the same row at each position, among other rows
        assert torch.equal(alone[0], linear(batch, w)[r])
        assert torch.equal(alone[0], linear(rows, w)[r])


@pytest.mark.parametrize(("out", "inp"), [(128, 128), (257, 129), (129, 257)])
def test_linear_bf16_in_bf16_out(out: int, inp: int) -> None:
    w = quantize_weight(weight(out, inp, torch.bfloat16))
    x = activations(3, inp, torch.bfloat16)
    result = linear(x, w)
    assert result.dtype == torch.bfloat16 and result.shape == (3, out)
    exact, magnitude = exact_product(x, w)
    # As in fp32, plus the one rounding to bf16 at the end (8 significant bits: 2^-8 relative).
    assert bool(((result.double() - exact).abs() <= 2.0**-16 * magnitude + 2.0**-8 * exact.abs()).all())


def test_no_rows() -> None:
    w = quantize_weight(weight(129, 257))
    assert linear(torch.zeros(0, 257), w).shape == (0, 129)


def test_wrong_scale_shape_is_named() -> None:
    fp8 = quantize_weight(weight(257, 129))
    with pytest.raises(ValueError, match=r"scale_inv.*\(3, 2\).*not \(2, 2\)"):
        Fp8Weight(fp8.data, fp8.scale_inv[:2])
    with pytest.raises(ValueError, match=r"scale_inv.*float32"):
        Fp8Weight(fp8.data, fp8.scale_inv.double())
    with pytest.raises(ValueError, match=r"data.*float8_e4m3fn"):
        Fp8Weight(fp8.data.float(), fp8.scale_inv)
    with pytest.raises(ValueError, match=r"x must be \[rows, 129\]"):
        linear(torch.zeros(2, 128), fp8)


def test_transformers_reads_a_checkpoint_written_in_this_format_as_fp8_py_does(tmp_path: Path) -> None:
    # the format's reading (which block a scale covers, which way round) against the reference's:
    # a tiny Qwen3.5 whose MLP and attention products are quantized here, loaded by transformers
    # dequantized, holds the weights Fp8Weight.dequantized gives, bit for bit
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    config = transformers.Qwen3_5TextConfig(
        vocab_size=64, hidden_size=256, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
        head_dim=64, intermediate_size=384, linear_num_key_heads=1, linear_num_value_heads=2,
        linear_key_head_dim=64, linear_value_head_dim=64)
    torch.manual_seed(0)
    model = transformers.Qwen3_5ForCausalLM(config).to(torch.bfloat16)
    quantization = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                    "weight_block_size": [128, 128]}
    quantized = tiny_models.save_fp8(model, tmp_path, lambda name: name.endswith("_proj.weight") and (
        ".mlp." in name or ".self_attn." in name), quantization)
    dequantized = transformers.FineGrainedFP8Config(dequantize=True)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=dequantized,
                                                               dtype=torch.bfloat16)
    state = loaded.state_dict()
    # whole blocks, and rows fewer than a block (k and v: 64); transformers refuses a weight whose
    # rows run past whole blocks into a partial one (320 rows), which released shapes never have
    shapes = {tuple(weight.shape) for weight in quantized.values()}
    assert any(out < BLOCK for out, _ in shapes) and any(out % BLOCK == 0 for out, _ in shapes)
    for name, weight in quantized.items():
        assert torch.equal(state[name], weight.dequantized(torch.bfloat16)), name


def test_joined_parts_merge_where_the_numbers_stay_the_same() -> None:
    x = activations(5, 257)
    whole, partial = quantize_weight(weight(128, 257, seed=2)), quantize_weight(weight(129, 257, seed=3))
    merged = join((whole, partial))  # the upper part fills whole blocks: the lower one's blocks line up
    assert isinstance(merged, Fp8Weight) and merged.shape == (257, 257)
    apart = torch.cat((linear(x, whole), linear(x, partial)), dim=1)
    assert torch.equal(ops.linear(x, merged), apart)
    kept = join((partial, whole))  # 129 rows then 128: the second part's blocks would straddle
    assert isinstance(kept, Joined)
    assert torch.equal(ops.linear(x, kept), apart[:, [*range(128, 257), *range(128)]])
    rows = join((Rows(whole, torch.tensor([3, 1])), Rows(whole, torch.tensor([0])), weight(1, 257)))
    assert isinstance(rows, Joined) and isinstance(rows.parts[0], Rows)
    assert rows.parts[0].rows.tolist() == [3, 1, 0]
    assert torch.equal(ops.linear(x, rows)[:, :3], linear(x, whole)[:, [3, 1, 0]])
    assert isinstance(join((weight(1, 257), weight(1, 257))), torch.Tensor)

"""The MoE kernels with block-wise FP8 expert weights (tfd_kernels.moe_fp8) against tfd.model.fp8: its
bits where every dot is exact, then the float path's own bits after the products, a bound elsewhere, and
FP8 and float experts mixed in one launch. The helpers here serve test_moe_fp8_paths.py (a row's bits on
every path, the arguments checked) and test_moe_fp8_gpu.py (sm_90 code, the device)."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
from moe_inputs import make, make_shared

from tfd.model import fp8
from tfd_kernels import moe, sigmoid_gate
from tfd_kernels.moe_args import Weights

ULP = {torch.float32: 2.0 ** -23, torch.bfloat16: 2.0 ** -7}  # a unit in the last place, relative


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def stack(w: torch.Tensor) -> moe.Fp8Stack:
    """``w`` (one expert's [out, in] or stacked experts') quantized as a checkpoint holds it."""
    q = fp8.quantize_experts(w.float()) if w.dim() == 3 else fp8.quantize_weight(w.float())
    return moe.Fp8Stack(q.data, q.scale_inv)


def one_expert(w: Weights, expert: int) -> Weights:
    """Expert ``expert``'s weights of a stack."""
    return moe.Fp8Stack(w.data[expert], w.scale_inv[expert]) if isinstance(w, moe.Fp8Stack) else w[expert]


def as_float(w: moe.Fp8Stack, dtype: torch.dtype) -> torch.Tensor:
    """The real weight in ``dtype`` (the same values where each is a small integer times a power of two)."""
    experts = fp8.Fp8Experts(w.data, w.scale_inv) if w.data.dim() == 3 else fp8.Fp8Weight(w.data, w.scale_inv)
    return experts.dequantized(dtype)


def floated(shared: moe.Shared, dtype: torch.dtype) -> moe.Shared:
    """An FP8 shared expert's real weights in ``dtype``."""
    assert isinstance(shared.gate_up, moe.Fp8Stack) and isinstance(shared.down, moe.Fp8Stack)
    return shared._replace(gate_up=as_float(shared.gate_up, dtype), down=as_float(shared.down, dtype))


def fp8_inputs(rows: int, top_k: int, seed: int, *, dtype: torch.dtype = torch.bfloat16, experts: int = 8,
               hidden: int = 64, inner: int = 64, shared_inner: int = 64
               ) -> tuple[torch.Tensor, moe.Fp8Stack, moe.Fp8Stack, torch.Tensor, torch.Tensor, moe.Shared]:
    """moe_inputs' random inputs, the routed and shared experts' weights quantized."""
    x, gate_up, down, ids, weights = make(rows, top_k, dtype, seed, experts=experts, hidden=hidden,
                                          inner=inner)
    shared = make_shared(rows, dtype, seed, experts=experts, hidden=hidden, inner=shared_inner)
    return (x, stack(gate_up), stack(down), ids, weights,
            shared._replace(gate_up=stack(shared.gate_up), down=stack(shared.down)))


class Reference(NamedTuple):
    value: torch.Tensor  # [rows, hidden] in x's dtype
    slack: torch.Tensor  # float64 [rows, hidden]: how far the kernels' may be from value (``reference``)
    gates: list[torch.Tensor]  # each pair's gate values (fp32)
    middles: list[tuple[torch.Tensor, Weights]]  # each pair's h (x's dtype) and the down weight it meets


def _product(w: Weights, v: torch.Tensor) -> torch.Tensor:
    """``v`` [in] (its dtype) times ``w`` [out, in] in fp32: ``tfd.model.fp8.linear``'s math for FP8."""
    if isinstance(w, moe.Fp8Stack):
        return fp8.linear(v.float()[None], fp8.Fp8Weight(w.data, w.scale_inv))[0]
    return w.float() @ v.float()


ORDER = 2.0 ** -15  # two fp32 sums of the same 128 exact products: 2 * 128 * 2^-24 of their magnitudes apart


def _dequantized(w: Weights) -> torch.Tensor:
    """The real weight in float64."""
    return as_float(w, torch.float64) if isinstance(w, moe.Fp8Stack) else w.double()


def _inputs(w: Weights, v: torch.Tensor) -> torch.Tensor:
    """What ``_product`` multiplies ``w`` by, in float64: v, or where w is FP8 v quantized and dequantized."""
    if not isinstance(w, moe.Fp8Stack):
        return v.double()
    q, scales = fp8.quantize_rows(v.float()[None])
    return (q.double() * scales.double().repeat_interleave(fp8.BLOCK, 1)[:, :v.shape[0]])[0]


def _moved(h: torch.Tensor, moved: torch.Tensor, down: Weights) -> torch.Tensor:
    """How far each element of h may be from the reference's as the down product reads it (float64
    [inner]), h itself ``moved`` apart. Where ``down`` is FP8: its group's scale may move as far as the
    group's max does (plus a rounding), so its quantized value q times the scale that much; and where
    h / scale lies within that reach of a midpoint between two e4m3 values, q may round the other way:
    then as far as h moved and one e4m3 step (2^-9 at least) more, times the scale."""
    if not isinstance(down, moe.Fp8Stack):
        return moved
    q, scales = fp8.quantize_rows(h.float()[None])
    q, scale = q.double()[0].abs(), scales.double().repeat_interleave(fp8.BLOCK, 1)[0, :h.shape[0]]
    pad = -h.shape[0] % fp8.BLOCK
    groups = torch.nn.functional.pad(moved, (0, pad)).view(-1, fp8.BLOCK).amax(dim=1)
    biggest = torch.nn.functional.pad(h.double().abs(), (0, pad)).view(-1, fp8.BLOCK).amax(dim=1)
    relative = (groups / biggest.clamp(min=1e-300) + 2.0 ** -22).repeat_interleave(fp8.BLOCK)[:h.shape[0]]
    exact = h.double().abs() / scale  # the quotient e4m3 rounds
    step = 2.0 ** (exact.clamp(min=2 ** -6).log2().floor() - 3)
    middle = ((exact / step).floor() + 0.5) * step
    flips = (exact - middle).abs() <= 2 * (moved / scale + exact * relative)
    return torch.where(flips, moved + (step + q * relative) * scale, q * relative * scale)


def reference(x: torch.Tensor, gate_up: Weights, down: Weights, ids: torch.Tensor, weights: torch.Tensor,
              shared: moe.Shared | None = None, order: float = ORDER) -> Reference:
    """``tfd_kernels.moe.reference``'s arithmetic with each product by ``_product``, and a bound on the
    kernels' distance from it. Both make the same products from the same quantized values and scales,
    each K block's 128 exact products summed in another order (``order`` of their magnitudes apart), so
    the gate and up values g and u are that far apart; silu's slope is 1.1 at most, so h is 1.1 |u| dg
    + |silu(g)| du apart, and four units of its dtype's last place more (the interpreter's exp and casts
    against torch's: its bf16 cast truncates). Through the down product that is ``_moved``'s distance
    times |weights|, the product's own order, times |the pair's weight|; then four units of x's dtype of
    the output and of every term's magnitude (each routed term's rounding, the sum's, the shared expert's
    value, its gate's, the gated sum's)."""
    rows, hidden = x.shape
    total = torch.zeros(rows, hidden, device=x.device)
    slack = torch.zeros(rows, hidden, dtype=torch.float64, device=x.device)
    magnitude = torch.zeros_like(slack)
    gates: list[torch.Tensor] = []
    middles: list[tuple[torch.Tensor, Weights]] = []

    def expert(gu: Weights, dn: Weights, row: int, weight: float) -> torch.Tensor:
        both = _product(gu, x[row])
        inner = both.shape[0] // 2
        gate, up = both[:inner], both[inner:]
        silu = gate / (1.0 + torch.exp(-gate))
        h = (silu * up).to(x.dtype)
        gates.append(gate)
        middles.append((h, dn))
        apart = order * (_dequantized(gu).abs() @ _inputs(gu, x[row]).abs())
        moved = 1.1 * up.double().abs() * apart[:inner] + silu.double().abs() * apart[inner:]
        moved += 4 * ULP[x.dtype] * h.double().abs()
        w = _dequantized(dn).abs()
        slack[row] += abs(weight) * (w @ _moved(h, moved, dn) + order * (w @ _inputs(dn, h).abs()))
        magnitude[row] += abs(weight) * (w @ h.double().abs())
        return _product(dn, h)

    for row, chosen in enumerate(ids.tolist()):
        for slot in sorted(range(len(chosen)), key=lambda s: (chosen[s], s)):
            weight = weights[row, slot].float()
            expert_of = chosen[slot]
            term = weight * expert(one_expert(gate_up, expert_of), one_expert(down, expert_of), row,
                                   float(weight))
            total[row] += term.to(x.dtype).float() if moe.TERMS_ROUNDED else term  # as the buffer holds it
    out = total.to(x.dtype)
    if shared is not None:
        value = torch.stack([expert(shared.gate_up, shared.down, row, 1.0) for row in range(rows)])
        value = value.to(x.dtype)
        sig = (1.0 / (1.0 + torch.exp(-shared.gate.float()))).to(x.dtype).float()
        out = (out.float() + (value.float() * sig).to(x.dtype).float()).to(x.dtype)
    return Reference(out, slack + 4 * ULP[x.dtype] * (out.double().abs() + magnitude), gates, middles)


def band(shape: tuple[int, ...], seed: int, scale: float, signed: bool, height: int = fp8.BLOCK
         ) -> torch.Tensor:
    """Values whose magnitudes lie within a factor of 2 of each other in each ``height`` x 128 block,
    the block's own factor in [0.5, 2) times ``scale``: quantized by such blocks, every value is a
    multiple of 16 in [224, 448] (e4m3's grid there)."""
    gen = generator(seed)
    values = (1 + torch.rand(shape, generator=gen)) * scale
    if signed:
        values *= torch.randint(0, 2, shape, generator=gen) * 2 - 1
    rows, cols = shape[-2], shape[-1]
    factors = torch.rand(*shape[:-2], -(-rows // height), fp8.blocks(cols), generator=gen) * 1.5 + 0.5
    factors = factors.repeat_interleave(height, -2)[..., :rows, :].repeat_interleave(fp8.BLOCK, -1)
    return values * factors[..., :cols]


def assert_exact(q: torch.Tensor, data: torch.Tensor) -> None:
    """Each K block's fp32 dot of quantized rows ``q`` [rows, k] and weights ``data`` [n, k] is exact in
    any order: integer products, each a multiple of t (a power of two), their magnitudes summing below
    2^24 t, so every partial sum is a multiple of t that fp32 holds."""
    q, data = q.double(), data.double()
    assert torch.equal(q.round(), q) and torch.equal(data.round(), data)
    for start in range(0, q.shape[1], fp8.BLOCK):
        products = q[:, None, start:start + fp8.BLOCK] * data[None, :, start:start + fp8.BLOCK]
        ints = products.abs().long()
        lowest = torch.where(ints > 0, ints & -ints, 2 ** 40).amin(dim=-1)  # the power of two in every one
        assert (products.abs().sum(dim=-1) < 2 ** 24 * lowest).all()


@pytest.mark.parametrize(("hidden", "inner", "shared_inner"), [(64, 64, 192), (200, 128, 64), (64, 192, 128)])
def test_exact_products_give_the_references_bits(hidden: int, inner: int, shared_inner: int) -> None:
    # Every quantized value a multiple of 16 (band) and every middle an integer: each block's dot is exact
    # in any order, so the products are the reference's bits whatever the scales (a block's own factor in
    # [0.5, 2), so a scale read from the wrong block shows). Gates of 110 and more (positive inputs) make
    # silu(g) = g exactly in numpy and torch (exp(-g) is 0), and a shared gate of 200 a sigmoid of 1, so
    # every later step is an fp32 operation both make alike: the kernels' output is the reference's.
    rows, experts, top_k = 5, 4, 2
    x = band((rows, hidden), seed=1, scale=4.0, signed=False, height=1)
    gate_up = stack(band((experts, 2 * inner, hidden), seed=2, scale=4.0, signed=False))
    down = stack(band((experts, hidden, inner), seed=3, scale=1.0, signed=True))
    shared = moe.Shared(stack(band((2 * shared_inner, hidden), seed=4, scale=4.0, signed=False)),
                        stack(band((hidden, shared_inner), seed=5, scale=1.0, signed=True)),
                        torch.full((rows, 1), 200.0))
    ids = torch.rand(rows, experts, generator=generator(6)).argsort(dim=1)[:, :top_k]
    weights = torch.rand(rows, top_k, generator=generator(7)) + 0.1
    want = reference(x, gate_up, down, ids, weights, shared)
    assert min(float(gate.min()) for gate in want.gates) >= 110
    q = fp8.quantize_rows(x)[0]
    for data in (*gate_up.data, shared.gate_up.data):
        assert_exact(q, data)
    for h, weight in want.middles:
        assert isinstance(weight, moe.Fp8Stack)
        assert_exact(fp8.quantize_rows(h[None])[0], weight.data)
    assert torch.equal(moe.experts(x, gate_up, down, ids, weights, shared), want.value)


def grid(shape: tuple[int, ...], seed: int, power: int, height: int = fp8.BLOCK) -> torch.Tensor:
    """Integers in [-8, 8] with one +-448 in each ``height`` x 128 block, times 2^``power``: quantized,
    a block's scale is 2^power and its values the integers, so dequantized they are these values again
    (in bf16 too), and products of two such sum exactly in fp32 in any order."""
    gen = generator(seed)
    values = torch.randint(-8, 9, shape, generator=gen).float()
    flat = values.view(-1, shape[-2], shape[-1])
    for block in flat:
        for r in range(0, shape[-2], height):
            for c in range(0, shape[-1], fp8.BLOCK):
                rows, cols = min(height, shape[-2] - r), min(fp8.BLOCK, shape[-1] - c)
                at = int(torch.randint(0, rows * cols, (1,), generator=gen))
                block[r + at // cols, c + at % cols] = 448.0 if at % 2 else -448.0
    return values * 2.0 ** power


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("hidden", "inner"), [(64, 192), (200, 64)])
def test_fp8_gate_up_products_are_exact_then_everything_is_the_float_paths(hidden: int, inner: int,
                                                                           dtype: torch.dtype) -> None:
    # x and the gate/up weights on grids that quantize losslessly (scales of powers of two): the FP8
    # products are then the exact products, as the float path's are on the dequantized weights, and with
    # float down weights the two calls must agree bit for bit: the middle, the down product, the ranked
    # sum and the shared expert's gate after the FP8 products are the float path's own code.
    rows, top_k = 6, 3
    x = grid((rows, hidden), seed=hidden, power=-6, height=1).to(dtype)
    _, _, down, ids, weights = make(rows, top_k, dtype, seed=inner, hidden=hidden, inner=inner)
    float_shared = make_shared(rows, dtype, seed=inner, hidden=hidden, inner=inner)
    gate_up = stack(grid((8, 2 * inner, hidden), seed=inner, power=-7))
    shared_gate_up = stack(grid((2 * inner, hidden), seed=inner + 1, power=-7))
    shared = float_shared._replace(gate_up=shared_gate_up)
    assert torch.equal(fp8.quantize_rows(x)[0].float() * 2.0 ** -6, x.float())  # lossless
    got = moe.experts(x, gate_up, down, ids, weights, shared)
    want = moe.experts(x, as_float(gate_up, dtype), down, ids, weights,
                       shared._replace(gate_up=as_float(shared_gate_up, dtype)))
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("hidden", "inner", "shared_inner"), [(64, 64, 128), (200, 192, 64)])
def test_random_weights_are_within_a_units_reach_of_the_reference(hidden: int, inner: int, shared_inner: int,
                                                                  dtype: torch.dtype) -> None:
    # Normal inputs: the dots are no longer exact, and the interpreter's exp and casts are not torch's,
    # so a middle may quantize one e4m3 step apart; Reference.slack bounds what that can do.
    x, gate_up, down, ids, weights, shared = fp8_inputs(5, 3, seed=hidden + inner, dtype=dtype, hidden=hidden,
                                                        inner=inner, shared_inner=shared_inner)
    want = reference(x, gate_up, down, ids, weights, shared)
    got = moe.experts(x, gate_up, down, ids, weights, shared)
    assert ((got.double() - want.value.double()).abs() <= want.slack).all()


def shared_alone(x: torch.Tensor, shared: moe.Shared) -> torch.Tensor:
    """The shared expert run as the only routed expert of weight 1, rounded."""
    def one(w: Weights) -> Weights:
        return moe.Fp8Stack(w.data[None], w.scale_inv[None]) if isinstance(w, moe.Fp8Stack) else w[None]

    rows = x.shape[0]
    ids = torch.zeros(rows, 1, dtype=torch.int64, device=x.device)
    return moe.experts(x, one(shared.gate_up), one(shared.down), ids, torch.ones(rows, 1, device=x.device))


@pytest.mark.parametrize(("routed_fp8", "shared_fp8"), [(True, False), (False, True), (True, True)])
def test_either_kind_of_shared_expert_is_one_expert_more_then_the_gate_kernel(routed_fp8: bool,
                                                                            shared_fp8: bool) -> None:
    """Bit for bit, the two kinds mixed in one launch: the routed sum, and the shared expert as an expert
    of weight 1 rounded, then tfd_kernels.sigmoid_gate of the two."""
    x, gate_up, down, ids, weights, shared = fp8_inputs(7, 3, seed=12, shared_inner=128)
    if not routed_fp8:
        gate_up, down = as_float(gate_up, x.dtype), as_float(down, x.dtype)
    if not shared_fp8:
        shared = floated(shared, x.dtype)
    want = sigmoid_gate.sigmoid_gate(shared_alone(x, shared), shared.gate, moe.experts(x, gate_up, down, ids,
                                                                                        weights))
    assert torch.equal(moe.experts(x, gate_up, down, ids, weights, shared), want)

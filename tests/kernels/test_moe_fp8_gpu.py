"""The MoE kernels with FP8 expert weights on Hopper: the code they compile to for sm_90 (read here, no
GPU needed), and on a GPU at the released models' sizes a row's bits alone and in any batch (1 to 64
rows, a prompt's tiles, one launch, a captured step), the reference's bound, the two kinds mixed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from moe_inputs import REAL, gate_rows, make_real, make_real_shared, residual_of, router_product
from test_moe_fp8 import floated, reference, shared_alone, stack

from support import compiled_for_hopper
from tfd_kernels import gemm, moe, moe_one, norm, sigmoid_gate

# Compiles the FP8 kernels for sm_90 as the launchers do (bf16 rows, FP8 experts; the shared expert FP8
# or bf16 beside them) and prints, for each, how often each PTX instruction that carries the numerics
# appears, or its error.
HOPPER_SCRIPT = r"""
import json, re, sys
from triton.compiler import ASTSource
from hopper_ptx import counted, signature
from tfd_kernels import moe, moe_fp8, moe_one, moe_pairs

FOUND = re.compile(r"\b(wgmma\.mma_async\S+|mma\.sync\S+|div\.[\w.]*f32|fma\.rn\.f32|mul\.rn\.\S*f32"
                   r"|cvt\.rn\.satfinite\.e4m3x2\.f32)")
BF16, FP8, F32, I32 = "*bf16", "*fp8e4nv", "*fp32", "*i32"
COMMON = dict(PRECISION="tf32", WIDEN=False, BLOCK_M=moe.FP8_M, BINS=512, GROUP=0, FP8=True, PDL=True)
GATE_UP = dict(x=BF16, xq=FP8, x_scales=F32, gate_up=FP8, gate_scales=F32, shared_gate_up=BF16,
               shared_scales=F32, h=BF16, layout=I32, pair_at=I32, logits=BF16, ids="*i64", weights=BF16,
               dest_at=I32, tile_expert=I32)
DOWN = dict(h=BF16, hq=FP8, h_scales=F32, down=FP8, down_scales=F32, shared_down=FP8, shared_scales=F32,
            buf=BF16, weights=BF16, layout=I32, pair_at=I32, dest_at=I32, tile_expert=I32, gate=BF16,
            residual=BF16, total=BF16, normed=BF16, norm_weight=BF16, arrivals=I32)
ONE = {**dict.fromkeys(("x", "h", "buf", "logits", "weights", "gate", "residual", "total", "out",
                        "norm_weight", "router_w"), BF16),  # the buffer of terms in the model dtype
       **dict.fromkeys(("gate_scales", "shared_gate_scales", "down_scales", "shared_down_scales",
                        "tile_weight", "partials"), F32),
       **dict.fromkeys(("pair_at", "dest_at", "tile_expert", "chosen", "ready", "arrivals", "blocks",
                        "router_counters"), I32),
       **dict.fromkeys(("x_scales", "h_scales"), F32),
       **dict.fromkeys(("xq", "hq", "gate_up", "down", "shared_gate_up", "shared_down"), FP8), "ids": "*i64"}
CASES = {
    "gate_up": (moe_pairs._gate_up, GATE_UP, {}, dict(COMMON, BLOCK_N=moe.FP8_GATE_N, BLOCK_K=moe.GATE_K,
                ONE_ROW=False, K=8, NORM=True, BLOCK_E=256, SLOTS=8, SHARED_FP8=False),
                dict(num_warps=4, num_stages=4)),
    "down": (moe_pairs._down, DOWN, {"eps": "fp32"}, dict(COMMON, BLOCK_N=moe.FP8_DOWN_N, BLOCK_K=moe.DOWN_K,
             ONE_ROW=False, FINISH=False, TOP_K=8, SHARED=True, HIDDEN_BLOCK=2048, SHARED_FP8=True),
             dict(num_warps=4, num_stages=3)),
    "one_row": (moe_one._one_row, ONE, {"eps": "fp32"}, dict(
        K=8, NORM=True, BLOCK_E=256, SLOTS=8, TILES=9, GATE_COLS=16, DOWN_COLS=32, PRECISION="tf32",
        WIDEN=False, BLOCK_M=moe.FP8_M, GATE_N=moe.FP8_GATE_N, GATE_K=moe.GATE_K, DOWN_N=moe.FP8_DOWN_N,
        DOWN_K=moe.DOWN_K, SHARED=True, ADD_NORM=True, HIDDEN_BLOCK=2048, COUNTERS=moe_one.READY,
        ROUTER_TILES=9, ROUTER_SEGMENTS=4, ROUTER_M=16, ROUTER_N=32, ROUTER_K=128, LOGITS_CACHE=".cg",
        SHARED_FIRST=True, DOWN_SHARED_FIRST=True, TAKE_CHOICE=True, PRELOAD=4, SPREAD=True,
        FROM_PARTIALS=True, GATE_SEGMENTS=4, ROUTER_EARLY=1, GATE_FP8=True, SHARED_GATE_FP8=True,
        DOWN_FP8=True, SHARED_DOWN_FP8=True, QUANTIZE_M=moe_one.QUANTIZE_M, PDL=True),
        dict(num_warps=4, num_stages=4)),
    "quantize_middles": (moe_fp8._quantize_middles, dict(h=BF16, q=FP8, scales=F32), {},
                         dict(BLOCK_M=moe_fp8.QUANTIZE_ROWS, INTERPRETED=False, PDL=True), {}),
}
result = {}
for name, (fn, pointers, scalars, constexprs, options) in CASES.items():
    source = ASTSource(fn=fn, signature=signature(fn, pointers, constexprs, scalars), constexprs=constexprs)
    result[name] = counted(source, options, FOUND)
json.dump(result, sys.stdout)
"""


def test_the_fp8_kernels_compile_for_hopper_with_the_numerics_they_claim(tmp_path: Path) -> None:
    # The interpreter compiles nothing, so here is where an FP8 kernel that cannot build for the device
    # shows, and where its numerics are read: every fp8 product a warp group's wgmma (never mma.sync: the
    # same instructions for every tile), the quantization's correctly rounded divisions and round-to-
    # nearest e4m3 conversion (in the launch between the two products, and in the one launch, whose
    # tiles' last gate/up programs quantize the middles; the two launches' tiles load quantized rows
    # and divide nothing), each block's term rounded by mul.rn (no ftz), and no fma in the expert
    # launches (a product rounds before its add; the one launch's fmas are its norm's, as in the float
    # path). The float shared expert's bf16 products beside FP8 ones are wgmma too.
    compiled = compiled_for_hopper(["-c", HOPPER_SCRIPT], tmp_path, [Path(__file__).parent])
    assert not [case for case in compiled.values() if "error" in case], compiled
    for name, found in compiled.items():
        quantizes = found.get("div.rn.f32") and found.get("cvt.rn.satfinite.e4m3x2.f32")
        assert not [op for op in found if "ftz" in op], (name, found)
        if name == "quantize_middles":
            assert quantizes and "fma.rn.f32" not in found, (name, found)
            continue
        fp8_products = {op for op in found if "e4m3.e4m3" in op}
        assert fp8_products and all(op.startswith("wgmma") for op in fp8_products), (name, found)
        assert found.get("mul.rn.f32"), (name, found)
        if name == "one_row":
            assert quantizes, (name, found)
        else:
            assert not [op for op in found if op.startswith("div.rn") or "e4m3x2.f32" in op], (name, found)
            assert "fma.rn.f32" not in found, (name, found)
    assert any(op.startswith("wgmma") and op.endswith("bf16.bf16") for op in compiled["gate_up"])


def real(rows: int, experts: int, top_k: int, seed: int
         ) -> tuple[torch.Tensor, moe.Fp8Stack, moe.Fp8Stack, torch.Tensor, torch.Tensor, moe.Shared]:
    """The released models' sizes on the GPU (hidden 2048, inner 512), every expert quantized."""
    x, gate_up, down, ids, weights = make_real(rows, experts, top_k, seed)
    shared = make_real_shared(rows, experts, seed)
    return (x, stack(gate_up), stack(down), ids, weights,
            shared._replace(gate_up=stack(shared.gate_up), down=stack(shared.down)))


def rows_alone_are(batch: torch.Tensor, rows: tuple[int, ...], x: torch.Tensor, gate_up: moe.Weights,
                   down: moe.Weights, ids: torch.Tensor, weights: torch.Tensor, shared: moe.Shared) -> None:
    """Each of ``rows`` run alone through ``moe.experts`` gives ``batch``'s bits for it."""
    for row in rows:
        part = slice(row, row + 1)
        alone = moe.experts(x[part], gate_up, down, ids[part], weights[part], gate_rows(shared, part))
        assert torch.equal(alone, batch[part]), row


@pytest.mark.gpu
@pytest.mark.parametrize(("experts", "top_k"), REAL)
def test_gpu_rows_1_to_64_are_the_bits_of_the_batch(experts: int, top_k: int) -> None:
    """Every prefix of 64 rows, given their choice and routed from logits (one row in one launch, a few
    choosing in the plan's launch, more through the router kernel), and rows alone: the batch's bits."""
    x, gate_up, down, ids, weights, shared = real(64, experts, top_k, seed=31)
    logits = router_product(64, experts, x.dtype, seed=31, device="cuda")
    shared = shared._replace(gate=logits[:, experts:])
    batch = moe.experts(x, gate_up, down, ids, weights, shared)
    routed = moe.routed(x, gate_up, down, logits[:, :experts], top_k, True, shared)
    for rows in range(1, 65):
        part = gate_rows(shared, slice(rows))
        got = moe.experts(x[:rows], gate_up, down, ids[:rows], weights[:rows], part)
        assert torch.equal(got, batch[:rows]), rows
        got = moe.routed(x[:rows], gate_up, down, logits[:rows, :experts], top_k, True, part)
        assert torch.equal(got, routed[:rows]), rows
    rows_alone_are(batch, (0, 31, 63), x, gate_up, down, ids, weights, shared)


@pytest.mark.gpu
@pytest.mark.parametrize(("experts", "top_k"), REAL)
def test_gpu_one_row_in_one_launch_and_from_the_blocks_input_is_the_same_bits(
        experts: int, top_k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inner 512: the one launch's down programs load four K blocks of FP8 weights before h is ready."""
    x, gate_up, down, _, _, shared = real(1, experts, top_k, seed=32)
    stream = residual_of(1, x.dtype, seed=32, hidden=2048, device="cuda")
    router_weight = (torch.randn(experts + 1, 2048, device="cuda") / 45).to(x.dtype)
    logits = gemm.matmul(x, router_weight)
    shared = shared._replace(gate=logits[:, experts:])
    for kind in ("fp8", "bf16"):  # the shared expert FP8, then bf16 beside FP8 routed experts
        if kind == "bf16":
            shared = floated(shared, x.dtype)
        monkeypatch.setattr(moe, "ONE_LAUNCH", True)
        one = moe.routed_add_zrms(x, gate_up, down, logits[:, :experts], top_k, True, shared, stream)
        parts = (shared.gate_up, shared.down)
        block = moe.block_add_zrms(x, router_weight, gate_up, down, top_k, True, parts, stream)
        monkeypatch.setattr(moe, "ONE_LAUNCH", False)
        two = moe.routed_add_zrms(x, gate_up, down, logits[:, :experts], top_k, True, shared, stream)
        routed = moe.routed(x, gate_up, down, logits[:, :experts], top_k, True, shared)
        added = norm.add_zrms(stream.x, routed, stream.weight, stream.eps)
        for got in (one, block, added):
            assert torch.equal(got[0], two[0]) and torch.equal(got[1], two[1]), kind
        assert not moe_one.counters(x.device).any()


@pytest.mark.gpu
def test_gpu_a_prompts_tiles_give_a_row_the_bits_of_decodes() -> None:
    """1,024 rows of top-8 among 256 experts take a prompt's column tiles and warps, 1,023 decode's
    (FP8 tiles are FP8_M pairs either way), a row alone the one launch's."""
    x, gate_up, down, ids, weights, shared = real(1024, 256, 8, seed=33)
    prompt = moe.experts(x, gate_up, down, ids, weights, shared)
    fewer = moe.experts(x[:1023], gate_up, down, ids[:1023], weights[:1023], gate_rows(shared, slice(1023)))
    assert torch.equal(fewer, prompt[:1023])
    rows_alone_are(prompt, (0, 511, 1023), x, gate_up, down, ids, weights, shared)


@pytest.mark.gpu
@pytest.mark.parametrize(("experts", "top_k"), REAL)
def test_gpu_products_are_near_the_reference(experts: int, top_k: int) -> None:
    # Hopper's fp8 wgmma adds a block's products at reduced precision (about 14 bits kept: fp8_gemm's
    # device test), so the dots may be 2^-10 of their magnitudes apart rather than 2^-15.
    x, gate_up, down, ids, weights, shared = real(4, experts, top_k, seed=34)
    want = reference(x, gate_up, down, ids, weights, shared, order=2.0 ** -10)
    got = moe.experts(x, gate_up, down, ids, weights, shared)
    assert ((got.double() - want.value.double()).abs() <= want.slack).all()


@pytest.mark.gpu
def test_gpu_either_kind_of_shared_expert_is_one_expert_more_then_the_gate_kernel() -> None:
    x, gate_up, down, ids, weights, shared = real(37, 256, 8, seed=35)
    for kind in ("fp8", "bf16"):
        if kind == "bf16":
            shared = floated(shared, x.dtype)
        want = sigmoid_gate.sigmoid_gate(shared_alone(x, shared), shared.gate,
                                         moe.experts(x, gate_up, down, ids, weights))
        assert torch.equal(moe.experts(x, gate_up, down, ids, weights, shared), want), kind


@pytest.mark.gpu
def test_gpu_a_captured_decode_step_replays_new_rows() -> None:
    x, gate_up, down, _, _, shared = real(1, 256, 8, seed=36)
    logits = router_product(1, 256, x.dtype, seed=36, device="cuda")
    shared = shared._replace(gate=logits[:, 256:])
    moe.routed(x, gate_up, down, logits[:, :256], 8, True, shared)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe.routed(x, gate_up, down, logits[:, :256], 8, True, shared)
    fresh_x = torch.randn(1, 2048, device="cuda").to(x.dtype)
    fresh_logits = router_product(1, 256, x.dtype, seed=37, device="cuda")
    x.copy_(fresh_x)
    logits.copy_(fresh_logits)
    graph.replay()
    fresh = moe.routed(fresh_x, gate_up, down, fresh_logits[:, :256], 8, True, shared._replace(
        gate=fresh_logits[:, 256:]))
    assert torch.equal(out, fresh)

"""Issue 34: where the FP8 decode step's time goes, product by product. For each of a shape's products at 1
and 32 rows: ``quantize`` alone, the FP8 product with its quantize (default plan), the product's launch
without a quantize in front (the rows given quantized: ``fp8_gemm._spread`` called as ``matmul`` does), the
spread tile and K-segment target variants, and the bf16 GEMM; each timed as 20 back-to-back calls in one
CUDA graph (as a decode step runs them: the launch gaps and PDL overlap counted, a replay's own overhead
spread over 20), microseconds a call. Run after install.sh: ``python .dev/fp8_diag.py [shape]``."""
import sys

import torch
import triton
import triton.language as tl

from tfd.bench.gemm import weight_shapes
from tfd.bench.main import random_model
from tfd.bench.roofline import copy_gbps, timed
from tfd.model.fp8 import quantize_weight
from tfd_kernels import fp8_gemm, gemm, gemm_plan, pdl, runtime
from tfd_kernels.gemm import summed, weight_tile
from tfd_kernels.runtime import INTERPRETED

dev = torch.device("cuda")
REPEAT = 20


# An experiment, not tfd's math (yet): the rows quantized inside the product by a reciprocal a group
# (inv = 448 / max, q = x * inv: one multiply an element, two divisions a row and group), so no quantize
# launch goes before it and no column tile divides a padded tile of rows.
@triton.jit
def fused_term(x, w, w_scales, rows, cols, m, n, k, start, stride_xm, stride_wn, stride_sn, stride_sk,
               BLOCK_K: tl.constexpr, EXACT_CAST: tl.constexpr):
    ks = start + tl.arange(0, BLOCK_K)
    a = tl.load(x + rows[:, None] * stride_xm + ks[None, :], mask=(rows[:, None] < m) & (ks[None, :] < k),
                other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(a), axis=1)
    limit = tl.full(amax.shape, 448.0, tl.float32)
    scale = tl.math.div_rn(amax, limit)
    inv = tl.where(scale > 0, tl.math.div_rn(limit, amax), 0.0)
    scale = tl.where(scale > 0, scale, 1.0)
    q = fp8_gemm.cast(tl.clamp(a * inv[:, None], -448.0, 448.0), tl.float8e4nv, EXACT_CAST)
    b = weight_tile(w, cols, n, k, start, stride_wn, BLOCK_K)
    w_scale = tl.load(w_scales + (cols // BLOCK_K) * stride_sn + (start // BLOCK_K) * stride_sk, mask=cols < n,
                      other=0.0)
    dot = tl.dot(q, tl.trans(b), out_dtype=tl.float32)
    return dot * (scale[:, None] * w_scale[None, :])


@triton.jit(do_not_specialize=["m", "stride_ps"])
def _fused(x, w, w_scales, partials, out, counters, m, n, k, stride_xm, stride_wn, stride_sn, stride_sk,
           stride_ps, stride_pm, stride_om, k_per_segment, SEGMENTS: tl.constexpr, BLOCK_M: tl.constexpr,
           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EXACT_CAST: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    start = tl.program_id(2) * k_per_segment
    acc = fused_term(x, w, w_scales, rows, cols, m, n, k, start, stride_xm, stride_wn, stride_sn, stride_sk,
                     BLOCK_K, EXACT_CAST)
    for offset in range(BLOCK_K, tl.minimum(k_per_segment, k - start), BLOCK_K):
        acc += fused_term(x, w, w_scales, rows, cols, m, n, k, start + offset, stride_xm, stride_wn, stride_sn,
                          stride_sk, BLOCK_K, EXACT_CAST)
    mask = (rows[:, None] < m) & (cols[None, :] < n)
    if SEGMENTS == 1:
        tl.store(out + rows[:, None] * stride_om + cols[None, :], acc.to(out.dtype.element_ty), mask=mask)
    else:
        where = rows[:, None] * stride_pm + cols[None, :]
        tl.store(partials + tl.program_id(2) * stride_ps + where, acc, mask=mask)
        tl.debug_barrier()
        tile = counters + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
        if tl.atomic_add(tile, 1, sem="acq_rel", scope="gpu") == SEGMENTS - 1:
            total = summed(partials, stride_ps, where, mask, SEGMENTS).to(out.dtype.element_ty)
            tl.store(out + rows[:, None] * stride_om + cols[None, :], total, mask=mask)
            tl.atomic_xchg(tile, 0, sem="relaxed", scope="gpu")


def fused(x, weight, out, choice, tiles):
    m, k = x.shape
    n = weight.data.shape[0]
    one = choice.segments == 1
    partials = out if one else torch.empty(choice.segments, m, n, dtype=torch.float32, device=dev)
    counters = runtime.counters("fp8_diag.fused", fp8_gemm.COUNTERS, dev)
    grid = (triton.cdiv(n, tiles.block_n), triton.cdiv(m, tiles.block_m), choice.segments)

    def run():
        _fused[grid](x, weight.data, weight.scale_inv, partials, out, counters, m, n, k, x.stride(0),
                     weight.data.stride(0), weight.scale_inv.stride(0), weight.scale_inv.stride(1),
                     0 if one else partials.stride(0), 0 if one else partials.stride(1), out.stride(0),
                     choice.k_per_segment, SEGMENTS=choice.segments, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
                     BLOCK_K=128, num_warps=tiles.warps, num_stages=tiles.stages, EXACT_CAST=INTERPRETED,
                     **fp8_gemm.OPTIONS,
                     **pdl.options(dev))
        return out
    return run


def per_call(fn) -> float:
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPEAT):
            fn()
    return timed(graph.replay, 20, dev) * 1e6 / REPEAT


def product_only(q, scales, weight, out, choice, tiles):
    """The spread launch alone, on rows already quantized (``matmul``'s own call)."""
    m, k = q.shape
    n = weight.data.shape[0]
    one = choice.segments == 1
    partials = out if one else torch.empty(choice.segments, m, n, dtype=torch.float32, device=dev)
    counters = runtime.counters("fp8_gemm.spread", fp8_gemm.COUNTERS, dev)
    grid = (triton.cdiv(n, tiles.block_n), triton.cdiv(m, tiles.block_m), choice.segments)

    def run():
        fp8_gemm._spread[grid](q, scales, weight.data, weight.scale_inv, partials, out, counters, m, n, k,
                               q.stride(0), scales.stride(0), weight.data.stride(0), weight.scale_inv.stride(0),
                               weight.scale_inv.stride(1), 0 if one else partials.stride(0),
                               0 if one else partials.stride(1), out.stride(0), choice.k_per_segment,
                               weight.data, out, out, 0,  # the conv's arguments: stand-ins, never read
                               SEGMENTS=choice.segments, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
                               BLOCK_K=128, CONV=False, WIDTH=2, num_warps=tiles.warps, num_stages=tiles.stages,
                               EXACT_CAST=INTERPRETED, **fp8_gemm.OPTIONS, **pdl.options(dev))
        return out
    return run


model, shape = random_model(sys.argv[1] if len(sys.argv) > 1 else "qwen3_5-9b", dev)
shapes = weight_shapes(model.weights)
del model
torch.cuda.empty_cache()
gbps = copy_gbps(dev)
print(f"copy {gbps:.0f} GB/s; shapes {shapes}; default target {gemm_plan.TARGET_PROGRAMS}", flush=True)
T = gemm_plan.Tiles
SPREADS = {"64x64w4s4": fp8_gemm.SPREAD, "64x128w4s4": T(64, 128, 128, 4, 4), "64x128w8s4": T(64, 128, 128, 8, 4),
           "64x256w8s3": T(64, 256, 128, 8, 3), "64x64w4s6": T(64, 64, 128, 4, 6), "64x32w4s4": T(64, 32, 128, 4, 4),
           "64x64w4s2": T(64, 64, 128, 4, 2)}
TARGETS = (132, 264, 528, 1056)
default_target = gemm_plan.TARGET_PROGRAMS
total = {}
for n, k in shapes:
    if n * k < 1 << 20 or k % 128:
        continue
    weight = quantize_weight(torch.randn(n, k, device=dev) * 0.02)
    bf16 = weight.dequantized(torch.bfloat16)
    floor = (n * k + weight.scale_inv.numel() * 4) / (gbps * 1e3)  # us
    for rows in (1, 32):
        x = torch.randn(rows, k, dtype=torch.bfloat16, device=dev)
        want = fp8_gemm.matmul(x, weight.data, weight.scale_inv)
        q, scales = fp8_gemm.quantize(x)
        quantize_us = per_call(lambda x=x: fp8_gemm.quantize(x))
        whole_us = per_call(lambda x=x, w=weight: fp8_gemm.matmul(x, w.data, w.scale_inv))
        line = []
        for name, tiles in (("64x64w4s4", fp8_gemm.SPREAD), ("64x128w4s4", T(64, 128, 128, 4, 4))):
            choice = gemm_plan.plan(n, k, spread=tiles, few=tiles, mid=tiles, middle=tiles, whole=fp8_gemm.WHOLE,
                                    whole_one=fp8_gemm.WHOLE)
            try:
                run = fused(x, weight, torch.empty(rows, n, dtype=torch.bfloat16, device=dev), choice, tiles)
                got = run().float()
                t = per_call(run)
                err = ((got - want.float()).abs().max() / want.float().abs().max()).item()
                line.append(f"FUSED s{choice.segments} {name} {t:.1f} ({floor / t:.0%}, rel err {err:.1e})")
            except Exception as error:
                line.append(f"FUSED {name} {type(error).__name__}: {str(error)[:80]}")
        for target in TARGETS:
            gemm_plan.TARGET_PROGRAMS = target
            for name, tiles in SPREADS.items():
                choice = gemm_plan.plan(n, k, spread=tiles, few=tiles, mid=tiles, middle=tiles, whole=fp8_gemm.WHOLE,
                                        whole_one=fp8_gemm.WHOLE)
                out = torch.empty(rows, n, dtype=torch.bfloat16, device=dev)
                try:
                    run = product_only(q, scales, weight, out, choice, tiles)
                    got = run().clone()
                    t = per_call(run)
                except Exception as error:  # a tile that does not build: say so, go on
                    line.append(f"t{target} {name} {type(error).__name__}: {str(error)[:60]}")
                    continue
                same = "" if torch.equal(got, want) else " DIFF"
                line.append(f"t{target}s{choice.segments} {name} {t:.1f} ({floor / t:.0%}){same}")
        gemm_plan.TARGET_PROGRAMS = default_target
        base = per_call(lambda x=x, w=bf16: gemm.matmul(x, w))
        total[rows] = [a + b for a, b in zip(total.get(rows, [0, 0, 0, 0]), [floor, quantize_us, whole_us, base])]
        print(f"[{n},{k}] rows {rows}: floor {floor:.1f} us; quantize {quantize_us:.1f}; fp8 with quantize "
              f"{whole_us:.1f} ({floor / whole_us:.0%}); bf16 {base:.1f} (bf16 floor {2 * floor:.1f}) | "
              + "; ".join(line), flush=True)
for rows, (floor, quantize_us, whole_us, base) in total.items():
    print(f"sum over products, rows {rows}: floor {floor:.0f} us, quantize {quantize_us:.0f}, fp8 {whole_us:.0f}, "
          f"bf16 {base:.0f}")

"""Issue 34: the FP8 GEMM's one-row products of the 9B (the decode step's) under deeper pipelines, more
programs, narrower column tiles and fewer segments: each variant's median microseconds a product, 20 back to back
in a CUDA graph (the product alone, rows quantized first; thirty-ninth session's numbers: one a graph, a launch in each),
its share of the weight's copy floor, DIFF where its bits differ from the default plan's. Run on the device
after install.sh: ``PYTHONPATH=/tmp/site python .dev/fp8_stages.py``. Then the swapped few-row form
(``fp8_gemm.SWAP_ROWS``) at 4, 6 and 8 stages against the default, at 1 and 16 rows;
``... fp8_stages.py swap`` runs those arms alone."""
import sys

import torch

from tfd.bench.roofline import copy_gbps, timed
from tfd.model.fp8 import quantize_weight
from tfd_kernels import fp8_gemm, gemm_plan

dev = torch.device("cuda")
REPEATS = 20  # products a graph replay runs back to back: the time is a replay's over them, no launch in it


def graphed(fn):
    """``fn`` REPEATS times in one CUDA graph (compiled before the capture): its replay."""
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPEATS):
            fn()
    return graph.replay

gbps = copy_gbps(dev)
print(f"copy {gbps:.0f} GB/s")
SHAPES = [(4096, 4096), (4096, 12288), (12352, 4096), (24576, 4096)]
# the pipeline's depth and the programs' count (thirty-ninth session: neither helped), then narrower column
# tiles with fewer segments: a program's fixed costs (filling its pipeline, the last program's sum of the
# segments' partials) weigh twice as much against FP8's half bytes as against bf16's
# fortieth session: the defaults (TARGET 132, 64 columns: 4,096-column products 3 segments, 192 programs),
# TARGET 128 (2 segments, 128 programs), 32-column tiles at TARGET 128, and fp8_gemm.BALANCED's segments
# (whole waves of 132 programs) with 64- and 32-column tiles ("bal": the target is the shape's own)
VARIANTS = {"t132": (132, gemm_plan.Tiles(64, 64, 128, 4, 4)), "t128": (128, gemm_plan.Tiles(64, 64, 128, 4, 4)),
            "n32t128": (128, gemm_plan.Tiles(64, 32, 128, 4, 4)), "bal64": ("bal", gemm_plan.Tiles(64, 64, 128, 4, 4)),
            "bal32": ("bal", gemm_plan.Tiles(64, 32, 128, 4, 4))}


def balanced(n, k, block_n, wave=132):
    """Programs at the least segments (each at least 4 K steps) whose last wave of ``wave`` is 90% full, else
    the fullest (the fortieth session's BALANCED arm, taken out of fp8_gemm after it lost: 4.68 ms against 4.47)."""
    tiles, most = -(-n // block_n), max(1, -(-k // 128) // 4)
    fills = [(tiles * s / (-(-tiles * s // wave) * wave), -s) for s in range(1, most + 1)]
    enough = [-s for fill, s in fills if fill >= 0.9]
    return tiles * (enough[0] if enough else -max(fills)[1])


# issue 34's swapped form (out^T = W . q^T: 64 weight columns the wgmma's M side, the rows its N side in a
# 16-row block, 10 KB a stage where the 64-row tile takes 16): (SWAP_ROWS, SWAP_STAGES), the default first and
# again last (drift)
SWAPS = {"base": (0, 4), "swap4": (16, 4), "swap6": (16, 6), "swap8": (16, 8), "base2": (0, 4)}


def swapped_arms(n, k, weight, floor):
    """Each of SWAPS' products of 1 and 16 rows, bf16 out, default plan: its time and share of the floor,
    DIFF where its bits (fp32 out or bf16) differ from the default's."""
    for rows in (1, 16):
        q, scales = fp8_gemm.quantize(torch.randn(rows, k, dtype=torch.bfloat16, device=dev))
        line, want = [], None
        for name, (swap_rows, stages) in SWAPS.items():
            fp8_gemm.SWAP_ROWS, fp8_gemm.SWAP_STAGES = swap_rows, stages  # read as each product launches
            try:
                bits = [fp8_gemm.product(q, scales, weight.data, weight.scale_inv, dtype)
                        for dtype in (torch.float32, torch.bfloat16)]
                replay = graphed(lambda q=q, scales=scales: fp8_gemm.product(
                    q, scales, weight.data, weight.scale_inv, torch.bfloat16))
                t = timed(replay, 30, dev) * 1e6 / REPEATS
            except Exception as error:  # an arm that does not build: say so, go on
                line.append(f"{name} {type(error).__name__}")
                continue
            finally:
                fp8_gemm.SWAP_ROWS, fp8_gemm.SWAP_STAGES = 0, 4
            want = bits if want is None else want
            same = "" if all(torch.equal(a, b) for a, b in zip(bits, want, strict=True)) else " DIFF"
            line.append(f"{name} {t:.1f} ({100 * floor / t:.0f}%){same}")
        print(f"[{n},{k}] {rows} row{'s' if rows > 1 else ''}, floor {floor:.1f} us: " + "; ".join(line),
              flush=True)


for n, k in SHAPES:
    weight = quantize_weight(torch.randn(n, k, device=dev) * 0.02)
    floor = (n * k + weight.scale_inv.numel() * 4) / (gbps * 1e3)
    if "swap" in sys.argv[1:]:
        swapped_arms(n, k, weight, floor)
        continue
    x = torch.randn(1, k, dtype=torch.bfloat16, device=dev)
    q, scales = fp8_gemm.quantize(x)
    want = fp8_gemm.product(q, scales, weight.data, weight.scale_inv, x.dtype)
    line = []
    for name, (target, tiles) in VARIANTS.items():
        target = balanced(n, k, tiles.block_n) if target == "bal" else target
        choice = gemm_plan.plan(n, k, spread=tiles, few=tiles, mid=tiles, middle=tiles, whole=fp8_gemm.WHOLE,
                                whole_one=fp8_gemm.WHOLE, target=target)
        try:
            got = fp8_gemm.product(q, scales, weight.data, weight.scale_inv, x.dtype, spread=True, choice=choice)
            t = timed(graphed(lambda c=choice: fp8_gemm.product(q, scales, weight.data, weight.scale_inv,
                                                                 torch.bfloat16, spread=True, choice=c)), 30, dev) * 1e6 / REPEATS
        except Exception as error:  # a variant that does not build: say so, go on
            line.append(f"{name} {type(error).__name__}")
            continue
        same = "" if torch.equal(got, want) else " DIFF"
        line.append(f"{name}/{choice.segments} {t:.1f} ({100 * floor / t:.0f}%){same}")
    print(f"[{n},{k}] floor {floor:.1f} us: " + "; ".join(line), flush=True)
    swapped_arms(n, k, weight, floor)

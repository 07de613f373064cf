"""Issue 34: the FP8 GEMM's tiles and K segments swept at a shape's decode products (1 and 32 rows) and a
prompt's (1,024 rows), beside the bf16 GEMM on the same weights and each FP8 weight's copy floor. Run on
the device after install.sh: ``PYTHONPATH=/tmp/site python .dev/fp8_sweep.py [shape]``. Prints a line a
product and row count: each variant's median microseconds under a CUDA graph (the quantize launch
included), DIFF where its bits differ from the default plan's (tiles may follow the rows without a bit
changing; segments are one choice a weight shape), and the bf16 product's time."""
import sys

import torch

from tfd.bench.gemm import graphed, weight_shapes
from tfd.bench.main import random_model
from tfd.bench.roofline import copy_gbps, timed
from tfd.model.fp8 import quantize_weight
from tfd_kernels import fp8_gemm, gemm, gemm_plan

dev = torch.device("cuda")
model, shape = random_model(sys.argv[1] if len(sys.argv) > 1 else "qwen3_5-9b", dev)
shapes = weight_shapes(model.weights)
del model
torch.cuda.empty_cache()
gbps = copy_gbps(dev)
print(f"copy {gbps:.0f} GB/s; shapes {shapes}")
SPREADS = {"64x64w4": fp8_gemm.SPREAD, "64x128w4": gemm_plan.Tiles(64, 128, 128, 4, 4),
           "64x32w4": gemm_plan.Tiles(64, 32, 128, 4, 4), "64x64w4s6": gemm_plan.Tiles(64, 64, 128, 4, 6)}
WHOLES = {"128x128w8": fp8_gemm.WHOLE, "128x256w8": gemm_plan.Tiles(128, 256, 128, 8, 3),
          "64x256w4": gemm_plan.Tiles(64, 256, 128, 4, 4)}
TARGETS = (132, 264, 528)
default_target = gemm_plan.TARGET_PROGRAMS
for n, k in shapes:
    if n * k < 1 << 20 or k % 128:
        continue
    weight = quantize_weight(torch.randn(n, k, device=dev) * 0.02)
    bf16 = weight.dequantized(torch.bfloat16)
    floor = (n * k + weight.scale_inv.numel() * 4) / (gbps * 1e3)  # us
    for rows in (1, 32, 1024):
        x = torch.randn(rows, k, dtype=torch.bfloat16, device=dev)
        want = fp8_gemm.matmul(x, weight.data, weight.scale_inv)
        line = []
        variants = SPREADS if rows <= gemm_plan.SPREAD_ROWS else WHOLES
        for target in TARGETS:
            gemm_plan.TARGET_PROGRAMS = target
            for name, tiles in variants.items():
                spread = rows <= gemm_plan.SPREAD_ROWS
                choice = gemm_plan.plan(n, k, spread=tiles, few=tiles, mid=tiles, middle=tiles, whole=fp8_gemm.WHOLE,
                                        whole_one=fp8_gemm.WHOLE) if spread \
                    else gemm_plan.plan(n, k, whole=tiles, whole_one=tiles, spread=fp8_gemm.SPREAD,
                                        few=fp8_gemm.SPREAD, mid=fp8_gemm.SPREAD, middle=fp8_gemm.MIDDLE)
                try:
                    got = fp8_gemm.matmul(x, weight.data, weight.scale_inv, spread=spread, choice=choice)
                    t = timed(graphed(lambda x=x, w=weight, c=choice, s=spread: fp8_gemm.matmul(
                        x, w.data, w.scale_inv, spread=s, choice=c)), 30, dev) * 1e6
                except Exception as error:  # a tile that does not build: say so, go on
                    line.append(f"t{target} {name} {type(error).__name__}")
                    continue
                same = "" if torch.equal(got, want) else " DIFF"
                line.append(f"t{target}s{choice.segments} {name} {t:.1f}{same}")
        gemm_plan.TARGET_PROGRAMS = default_target
        base = timed(graphed(lambda x=x, w=bf16: gemm.matmul(x, w)), 30, dev) * 1e6
        print(f"[{n},{k}] rows {rows} (FP8 {n * k / 1e6:.0f} MB, floor {floor:.1f} us; bf16 {base:.1f} us): "
              + "; ".join(line), flush=True)

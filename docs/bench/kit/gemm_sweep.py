"""Issue 31, next session: the spread form's K segments and few-row tiles swept at Flash Next's decode
products (one row, 32 rows), against each weight's copy floor. Run on the device after install.sh:
``PYTHONPATH=/tmp/site python .dev/gemm_sweep.py [shape]``. Prints a line a product and row count:
each variant's median microseconds under a CUDA graph, DIFF where its bits differ from the plan's
(a new plan is one global choice a shape: bits may change with it, never with the rows)."""
import sys

import torch

from tfd.bench.gemm import graphed, weight_shapes
from tfd.bench.main import random_model
from tfd.bench.roofline import copy_gbps, timed
from tfd_kernels import gemm, gemm_plan

dev = torch.device("cuda")
model, shape = random_model(sys.argv[1] if len(sys.argv) > 1 else "qwen3_8-flash-next", dev)
shapes = weight_shapes(model.weights)
del model
torch.cuda.empty_cache()
gbps = copy_gbps(dev)
print(f"copy {gbps:.0f} GB/s; shapes {shapes}")
FEWS = {"16x64x128": gemm_plan.FEW, "16x128x128": gemm_plan.Tiles(16, 128, 128, 4, 4),
        "16x128x64s6": gemm_plan.Tiles(16, 128, 64, 4, 6), "16x32x256": gemm_plan.Tiles(16, 32, 256, 4, 4)}
TARGETS = (132, 264, 528, 1056)
STEPS = (4, 2, 1)  # gemm_plan.SEGMENT_STEPS: a narrow product's segments capped at 80 / steps
default_target, default_steps = gemm_plan.TARGET_PROGRAMS, gemm_plan.SEGMENT_STEPS
for n, k in shapes:
    if n * k < 1 << 20:
        continue
    w = torch.randn(n, k, dtype=torch.bfloat16, device=dev) * 0.02
    floor = n * k * 2 / (gbps * 1e3)  # us
    for rows in (1, 32):
        x = torch.randn(rows, k, dtype=torch.bfloat16, device=dev)
        try:  # a table read by rows (the n-gram embedding) is no product: more tiles than the GEMM counts
            want = gemm.matmul(x, w)
        except ValueError as error:
            print(f"[{n},{k}] rows {rows}: not a product here ({error})", flush=True)
            continue
        line = []
        for target in TARGETS:
            gemm_plan.TARGET_PROGRAMS = target
            for steps in STEPS:
                gemm_plan.SEGMENT_STEPS = steps
                for name, few in FEWS.items():
                    if (rows > 16 or steps != STEPS[0]) and name != "16x64x128":
                        continue
                    choice = gemm_plan.plan(n, k, few=few)
                    got = gemm.matmul(x, w, choice=choice)
                    t = timed(graphed(lambda x=x, w=w, c=choice: gemm.matmul(x, w, choice=c)), 50, dev) * 1e6
                    same = "" if torch.equal(got, want) else " DIFF"
                    line.append(f"t{target}s{choice.segments} {name} {t:.1f}{same}")
        gemm_plan.TARGET_PROGRAMS, gemm_plan.SEGMENT_STEPS = default_target, default_steps
        print(f"[{n},{k}] rows {rows} ({n * k * 2 / 1e6:.0f} MB, floor {floor:.1f} us): " + "; ".join(line),
              flush=True)

"""Issue 31: the batch-invariant GEMM's whole form at a prompt's rows (8,192: the MoE shapes' 8 x 1,024
prefill), its tiles swept at the 35B-A3B's and Qwen3-Next-80B-A3B's dense products (hidden 2,048: the GDN
and attention input products and the output product), the K segments held at the plan's. Prints a line a
product: each tile's median us under a CUDA graph, its TFLOP/s, DIFF where its bits differ from the plan's.
In the 35B-A3B's prefill profile (H100, 628a66c) these took 737, 551 and 279 us a call (73%, 72%, 63% of
the matmul rate the bench measures).

    PYTHONPATH=/tmp/site python .dev/gemm_prefill_sweep.py
"""
import os

import attrs
import torch

from tfd.bench.gemm import graphed
from tfd.bench.roofline import timed
from tfd_kernels import gemm, gemm_plan

dev = torch.device("cuda")
ROWS = 8192
# the MoE shapes' (hidden 2,048), then the 9B's (hidden 4,096: GDN and attention inputs, MLP gate|up and
# down, outputs), which the thirty-sixth session's sweep left out; SWEEP=short: the plan's tile against
# 128 x 128 x 64 in 4 and 5 stages only
SHAPES = [(12352, 2048), (9216, 2048), (2048, 4096), (257, 2048), (12352, 4096), (10240, 4096), (24576, 4096),
          (4096, 12288), (4096, 4096)]
T = gemm_plan.Tiles
WHOLE = {"128x128x128s3": T(128, 128, 128, 8, 3), "128x128x64s4": T(128, 128, 64, 8, 4),
         "128x256x64s3": T(128, 256, 64, 8, 3), "256x128x64s3": T(256, 128, 64, 8, 3),
         "128x128x64s5": T(128, 128, 64, 8, 5), "128x64x128s4": T(128, 64, 128, 4, 4)}
ONE = {"256x128x64s4": T(256, 128, 64, 8, 4), "128x256x64s4": T(128, 256, 64, 8, 4),
       "128x128x64s5": T(128, 128, 64, 8, 5), "256x128x32s6": T(256, 128, 32, 8, 6),
       "128x256x64s3": T(128, 256, 64, 8, 3), "256x64x64s5": T(256, 64, 64, 8, 5),
       "128x128x128s3": T(128, 128, 128, 8, 3)}
if os.environ.get("SWEEP") == "short":
    WHOLE = {name: WHOLE[name] for name in ("128x128x128s3", "128x128x64s4", "128x128x64s5")}
for n, k in SHAPES:
    w = torch.randn(n, k, dtype=torch.bfloat16, device=dev) * 0.02
    x = torch.randn(ROWS, k, dtype=torch.bfloat16, device=dev)
    base = gemm_plan.plan(n, k)
    want = gemm.matmul(x, w, choice=base)
    tiles = ONE if base.segments == 1 else WHOLE
    line = []
    for name, tile in tiles.items():
        choice = attrs.evolve(base, whole_one=tile) if base.segments == 1 else attrs.evolve(base, whole=tile)
        try:
            got = gemm.matmul(x, w, choice=choice)
            t = timed(graphed(lambda x=x, w=w, c=choice: gemm.matmul(x, w, choice=c)), 20, dev) * 1e6
        except Exception as error:  # a tile that does not fit is a line, not the end
            line.append(f"{name} fails ({str(error)[:60]})")
            continue
        same = "" if torch.equal(got, want) else " DIFF"
        line.append(f"{name} {t:.1f} us {2 * ROWS * n * k / t / 1e6:.0f} TF{same}")
    print(f"[{n},{k}] segments {base.segments}: " + "; ".join(line), flush=True)

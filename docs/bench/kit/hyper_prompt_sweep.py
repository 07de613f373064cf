"""Issue 31: Flash Next's two 83-us launches of a hyper read at its 1,024-row prefill (H200 profile, 33 of each
a prefill), alone, each timed under a CUDA graph (median us of 20 by CUDA events), bits against the default:

- the down rows' product [324, 10240] (20 K segments): the whole form's tile swept (the default 128 x 128 runs
  24 programs), at 1,024 rows and at Flash Next's other few-program prompt products;
- the prompt mix (4 streams of 2,560, rank 320): one launch against its three (hyper_mix.MIX_PROMPT_SPLIT) and
  the streams' products apart (hyper_mix.MIX_PROMPT_APART), with their prompt tiles.

    PYTHONPATH=/tmp/site python .dev/hyper_prompt_sweep.py   (SWEEP=mix: the mixes alone)
"""
import os

import attrs
import torch

from tfd.bench.gemm import graphed
from tfd.bench.roofline import timed
from tfd_kernels import gemm, gemm_plan
from tfd_kernels import hyper_mix as hyper_kernels

dev = torch.device("cuda")
T = gemm_plan.Tiles
WHOLE = {"128x128x128s3": T(128, 128, 128, 8, 3), "64x64x128s3": T(64, 64, 128, 4, 3),
         "64x64x128s4": T(64, 64, 128, 4, 4), "64x128x128s3": T(64, 128, 128, 4, 3),
         "128x64x128s3": T(128, 64, 128, 4, 3), "128x64x128s3w8": T(128, 64, 128, 8, 3),
         "64x64x64s5": T(64, 64, 64, 4, 5), "32x64x128s4": T(32, 64, 128, 4, 4)}
PRODUCTS = () if os.environ.get("SWEEP") == "mix" else ((1024, 324, 10240), (1024, 2560, 4096), (1024, 640, 2560),
                                                         (4096, 324, 10240))
# The apart form's columns are MIX_APART_COLUMNS (64 by default) since the forty-sixth session; its call 1 ran
# this sweep when they were MIX_PROMPT_COLUMNS's (its apart-c64 is apart at 64 columns).
APART = {"MIX_PROMPT_APART": 1}
ONE = {"MIX_PROMPT_APART": 0}
MIXES = (("one", ONE), ("split", {**ONE, "MIX_PROMPT_SPLIT": 1}), ("apart", APART),
         ("apart-w8", {**APART, "MIX_PROMPT_WARPS": 8}),
         ("apart-c32", {**APART, "MIX_APART_COLUMNS": 32}),
         ("apart-c64w8", {**APART, "MIX_APART_COLUMNS": 64, "MIX_PROMPT_WARPS": 8}),
         ("apart-c128", {**APART, "MIX_APART_COLUMNS": 128}), ("apart-c16", {**APART, "MIX_APART_COLUMNS": 16}),
         ("apart-r32", {**APART, "MIX_PROMPT_ROWS": 32}),
         ("apart-r128w8", {**APART, "MIX_PROMPT_ROWS": 128, "MIX_PROMPT_WARPS": 8}),
         ("apart-s2", {**APART, "MIX_PROMPT_STAGES": 2}), ("apart-k32", {**APART, "MIX_K": 32}),
         ("k32", {**ONE, "MIX_K": 32}))
if os.environ.get("SWEEP") != "mix":
    MIXES += (("r128", {**ONE, "MIX_PROMPT_ROWS": 128}), ("c16", {**ONE, "MIX_PROMPT_COLUMNS": 16}),
              ("c64", {**ONE, "MIX_PROMPT_COLUMNS": 64}), ("w8", {**ONE, "MIX_PROMPT_WARPS": 8}),
              ("s2", {**ONE, "MIX_PROMPT_STAGES": 2}), ("s1", {**ONE, "MIX_PROMPT_STAGES": 1}))
for rows, n, k in PRODUCTS:
    w = torch.randn(n, k, dtype=torch.bfloat16, device=dev) * 0.02
    x = torch.randn(rows, k, dtype=torch.bfloat16, device=dev)
    base = gemm_plan.plan(n, k)
    want = gemm.matmul(x, w, choice=base)
    line = []
    for name, tile in WHOLE.items():
        choice = attrs.evolve(base, whole=tile, whole_one=tile)
        try:
            got = gemm.matmul(x, w, choice=choice)
            t = timed(graphed(lambda x=x, w=w, c=choice: gemm.matmul(x, w, choice=c)), 20, dev) * 1e6
        except Exception as error:  # a tile that does not fit is a line, not the end
            line.append(f"{name} fails ({str(error)[:60]})")
            continue
        same = "" if torch.equal(got, want) else " DIFF"
        line.append(f"{name} {t:.1f} us{same}")
    print(f"{rows} x [{n},{k}] segments {base.segments}: " + "; ".join(line), flush=True)

for rows in (1024, 4096):
    g = torch.Generator().manual_seed(rows)
    projected = torch.randn(rows, 324, generator=g).bfloat16().to(dev)
    up = (torch.randn(4 * 2560, 320, generator=g) * 320 ** -0.5).bfloat16().to(dev)
    normed = torch.randn(rows, 4 * 2560, generator=g).bfloat16().to(dev)
    want = hyper_kernels.mix(projected, up, normed, 4, 2560)[0]
    line = []
    for name, values in MIXES:
        before = {key: getattr(hyper_kernels, key) for key in values}
        for key, value in values.items():
            setattr(hyper_kernels, key, value)
        try:
            got = hyper_kernels.mix(projected, up, normed, 4, 2560)[0]
            t = timed(graphed(lambda: hyper_kernels.mix(projected, up, normed, 4, 2560)), 20, dev) * 1e6
            line.append(f"{name} {t:.1f} us{'' if torch.equal(got, want) else ' DIFF'}")
        except Exception as error:
            line.append(f"{name} fails ({str(error)[:60]})")
        finally:
            for key, value in before.items():
                setattr(hyper_kernels, key, value)
    print(f"mix {rows} rows: " + "; ".join(line), flush=True)

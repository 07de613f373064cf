"""Mid-size row counts (a resumed turn's chunk): whole vs spread forms and taller spread tiles, 9B shapes."""
import torch, attrs
from kernels import gemm
from tfd.bench.main import random_model
from tfd.bench.gemm import weight_shapes, graphed
from tfd.bench.roofline import timed
dev = torch.device("cuda")
model, shape = random_model("qwen3_5-9b", dev)
shapes = weight_shapes(model.weights)
print("shapes", shapes)
variants = {
    "whole": dict(spread=False),
    "spread64": dict(spread=True),
    "spread128x64w8": dict(spread=True, tile=gemm.Tiles(128, 64, 128, 8, 3)),
    "spread128x64w4": dict(spread=True, tile=gemm.Tiles(128, 64, 128, 4, 3)),
    "spread128x64k64": dict(spread=True, tile=gemm.Tiles(128, 64, 64, 8, 4)),
}
totals = {}
for rows in (64, 128, 192, 256):
    for n, k in shapes:
        if n * k < 1 << 22: continue
        w = torch.randn(n, k, dtype=torch.bfloat16, device=dev) * 0.02
        x = torch.randn(rows, k, dtype=torch.bfloat16, device=dev)
        ref = gemm.matmul(x, w, spread=False)
        line = []
        for name, v in variants.items():
            choice = None
            if "tile" in v:
                base = gemm.plan(n, k)
                choice = attrs.evolve(base, spread=v["tile"])
            fn = lambda: gemm.matmul(x, w, spread=v["spread"], choice=choice)
            same = torch.equal(fn(), ref)
            t = timed(graphed(fn), 20, dev)
            totals[(rows, name)] = totals.get((rows, name), 0) + t
            line.append(f"{name} {t*1e6:.0f}us{'' if same else ' DIFF'}")
        print(f"rows {rows} [{n},{k}] {n*k*2/1e6:.0f} MB: " + ", ".join(line))
for (rows, name), t in sorted(totals.items()):
    print(f"total rows {rows} {name}: {t*1e6:.0f} us")

"""The prompt mix's two forms (one launch, streams apart) compiled for sm_90 on a machine without a GPU: each
tile's registers and spills (ptxas -v), bar.sync count and shared memory. Output: mix-ptx.txt.

    TRITON_INTERPRET=0 .venv/bin/python docs/bench/2026-12-07-s45/ptx/mix_ptx_probe.py
"""
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[4] / "tests" / "kernels"))
from hopper_ptx import signature  # noqa: E402

from tfd_kernels import hyper_mix  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
BF16 = "*bf16"
ptrs = dict.fromkeys(("projected", "up", "normed", "out", "weights"), BF16)

import subprocess, tempfile
from triton.backends.nvidia.compiler import get_ptxas
ptxas = get_ptxas(90).path
def probe(name, fn, extra, block_r, block_c, warps, stages):
    constexprs = dict(STREAMS=4, INJECTS=True, BLOCK_R=block_r, BLOCK_C=block_c, BLOCK_K=64, WIDEN=False, PDL=True, **extra)
    types = {**ptrs, "up_tiles": f"tensordesc<bf16[{block_c}, 64]>" if extra.get("TMA") else BF16}
    source = ASTSource(fn=fn, signature=signature(fn, types, constexprs, dict(streams="fp32")), constexprs=constexprs)
    k = triton.compile(source, target=HOPPER, options=dict(num_warps=warps, num_stages=stages))
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    out = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", f.name, "-o", "/dev/null"], capture_output=True, text=True)
    regs = [l.split("Used")[1].split(",")[0].strip() for l in out.stderr.splitlines() if "Used" in l]
    spill = [l.strip().split(",")[1].strip() for l in out.stderr.splitlines() if "spill" in l]
    bars = len(re.findall(r"bar\.sync", k.asm["ptx"]))
    print(f"{name:6} r{block_r} c{block_c} w{warps} s{stages}: {regs} {spill} bar.sync {bars} shared {k.metadata.shared}", flush=True)
for stages in (1, 2, 3):
    for name, fn, extra in (("one", hyper_mix._mix, dict(EARLY=0, REST=64)),
                            ("apart", hyper_mix._mix_apart, dict(TMA=False)),
                            ("tma", hyper_mix._mix_apart, dict(TMA=True))):
        for block_r, block_c, warps in ((64, 32, 4), (64, 32, 8), (64, 64, 8), (32, 32, 4), (128, 32, 8)):
            probe(name, fn, extra, block_r, block_c, warps, stages)

"""Issue 31, next session: QSA's decode choice sorted in registers (block_choice._choose) against the
radix select (_choose_long) at a row's block counts from a 2k to a 64k context, one row and 32, under
CUDA graphs; the compile time of each variant too (the sorted one at 8,192 blocks took three minutes
to compile on the 2-core CI machine). Picks MOST_BLOCKS. Run after install.sh:
``PYTHONPATH=/tmp/site python .dev/choice_sweep.py``."""
import time

import torch

from tfd.bench.gemm import graphed
from tfd.bench.roofline import timed
from tfd_kernels import block_choice

dev = torch.device("cuda")
for blocks in (512, 2048, 8192, 16384):
    for rows in (1, 32):
        positions = torch.full((rows,), blocks * 4 - 1, device=dev)
        scored = torch.rand(rows, blocks, device=dev)
        line = []
        for name, most in (("sorted", 1 << 30), ("radix", 0)):
            if name == "sorted" and blocks > block_choice.MOST_BLOCKS:
                continue
            began = time.perf_counter()
            got = block_choice.choose(scored, positions, 512, 4, most=most)
            torch.cuda.synchronize()
            first = time.perf_counter() - began
            def run(m: int = most, s: torch.Tensor = scored, p: torch.Tensor = positions) -> object:
                return block_choice.choose(s, p, 512, 4, most=m)

            t = timed(graphed(run), 50, dev)
            line.append(f"{name} {t * 1e6:.1f} us (first call {first:.1f} s)")
            if name == "radix" and blocks <= block_choice.MOST_BLOCKS:
                want = block_choice.choose(scored, positions, 512, 4)
                line.append("same" if torch.equal(got[0], want[0]) else "DIFFERENT")
        print(f"{blocks} blocks, {rows} rows: " + "; ".join(line), flush=True)

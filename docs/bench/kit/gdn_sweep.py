"""Issue 31: the GDN prefill's launches (tfd_kernels.gdn_prefill) at the MoE shapes' prompt, 8 lanes
x 1,024 rows of 16 key and 32 value heads (35B-A3B, 80B-A3B), and Flash Next's one lane of 1,024 rows of 48
value heads, under variants of their constants: each launch's device us (torch.profiler) and the output's
and states' digest against the first variant's. In the 35B-A3B's 8 x 1,024 prefill (H200, a5e6ce4) the
three took 2.15 ms a layer (_chunks 1.36), 29% of the prefill. A variant runs in a process of its own
(PRECISION is a global the kernels read when compiled).

    PYTHONPATH=/tmp/site python .dev/gdn_sweep.py [VARIANT ...]   (default: all below)
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import sys

VARIANTS: dict[str, dict[str, object]] = {
    "base": {},  # REFINED; the output formed in phase two's walk from 264 programs (FUSE_PROGRAMS)
    # (s38a.sh ran this sweep at df21f56, where FUSED=True/False chose the walk's output or phase three)
    "fused": {"gdn_prefill.FUSE_PROGRAMS": 0},
    "apart": {"gdn_prefill.FUSE_PROGRAMS": 1 << 30},  # phase three's own launch, as before df21f56
    "bv16": {"gdn_prefill.BLOCK_V": 16},  # twice the walks, fewer registers (223 against 254, offline ptxas)
    "st1": {"gdn_prefill.NUM_STAGES": 1},
    "st3": {"gdn_prefill.NUM_STAGES": 3},
    "not_refined": {"gdn_chunk.REFINED": False},  # tf32x3 everywhere: other bits
}
SHAPES = {"moe-8x1024": (8, 1024, 16, 32), "flashnext-1x1024": (1, 1024, 16, 48)}
DIM = 128


def child(name: str) -> None:
    import torch
    import triton.language as tl

    from tfd_kernels import gdn_chunk, gdn_prefill
    for key, value in VARIANTS[name].items():
        module, constant = key.split(".")
        target = {"gdn_chunk": gdn_chunk, "gdn_prefill": gdn_prefill}[module]
        setattr(target, constant, tl.constexpr(value) if constant == "PRECISION" else value)
    from torch.profiler import ProfilerActivity, profile
    for shape, (lanes, each, key_heads, value_heads) in SHAPES.items():
        rows = lanes * each
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k = (torch.randn(rows, key_heads, DIM, device="cuda", generator=gen).bfloat16() for _ in range(2))
        v = torch.randn(rows, value_heads, DIM, device="cuda", generator=gen).bfloat16()
        g = -torch.rand(rows, value_heads, device="cuda", generator=gen) * 0.5
        beta = torch.rand(rows, value_heads, device="cuda", generator=gen).sigmoid()
        size = value_heads * DIM * DIM
        states0 = torch.randn(lanes * size, device="cuda", generator=gen) * 0.01
        state_at = torch.arange(lanes, device="cuda", dtype=torch.int64) * size
        cu = torch.arange(lanes + 1, device="cuda", dtype=torch.int32) * each
        starts = torch.zeros(lanes, device="cuda", dtype=torch.int32)
        states = states0.clone()

        args = (q, k, v, g, beta, states, state_at, cu, starts, DIM ** -0.5, each)
        call = functools.partial(gdn_prefill.prefill, *args)
        out = call()
        digest = hashlib.sha256(out.cpu().numpy().tobytes() + states.cpu().numpy().tobytes()).hexdigest()[:12]
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            call()
        end.record()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                call()
            torch.cuda.synchronize()
        parts = {e.key: round(e.device_time_total / e.count, 1) for e in prof.key_averages()
                 if e.key in ("_chunks", "_scan", "_output")}
        print(json.dumps({"variant": name, "shape": shape, "ms": round(start.elapsed_time(end) / 20, 3),
                          "us": parts, "digest": digest}), flush=True)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return
    names = sys.argv[1:] or list(VARIANTS)
    first: dict[str, str] = {}
    for name in names:
        run = subprocess.run([sys.executable, __file__, "--child", name], capture_output=True, text=True,
                             timeout=300)
        for line in run.stdout.splitlines():
            row = json.loads(line)
            same = first.setdefault(row["shape"], row["digest"]) == row["digest"]
            print(f"{name:10} {row['shape']:17} {row['ms']:7.3f} ms  {row['us']}  "
                  f"{'same bits' if same else 'bits differ'}", flush=True)
        if run.returncode:
            print(f"{name}: rc {run.returncode}: {run.stderr[-600:]}", flush=True)


if __name__ == "__main__":
    main()

"""``tfd bench --gemm``: the batch-invariant GEMM against cuBLAS at a model's weight shapes.

For each distinct weight shape of the model and each row count, the median time of
``tfd_kernels.gemm.matmul`` and of ``torch.nn.functional.linear`` (cuBLAS) under CUDA graphs, the
weight bytes over that time as a fraction of the copy bandwidth, and whether each keeps row i's
bits the same across row counts (the property the exact path needs).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from tfd.bench.roofline import timed
from tfd_kernels import gemm

ROWS = (1, 8, 32, 256, 8192)


def weight_shapes(weights: object) -> list[tuple[int, int]]:
    """Distinct [n, k] shapes of the 2-D weights reachable from ``weights`` (attrs records)."""
    found: set[tuple[int, int]] = set()

    def walk(value: object) -> None:
        if isinstance(value, torch.Tensor):
            if value.dim() == 2 and value.shape[0] > 1 and value.shape[1] > 1:
                found.add((int(value.shape[0]), int(value.shape[1])))
        elif isinstance(value, (tuple, list)):
            for item in value:
                walk(item)
        elif hasattr(value, "__attrs_attrs__"):
            for field in value.__attrs_attrs__:
                walk(getattr(value, field.name))

    walk(weights)
    return sorted(found)


def graphed(fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
    """``fn`` captured once in a CUDA graph: timing without launch overhead, as decode runs it."""
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def invariant(product: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> bool:
    whole = product(x)
    return all(torch.equal(product(x[:m]), whole[:m]) for m in (1, 2, 3, 8, 16, 32, 64, 128))


def _ours(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return gemm.matmul(x, w)


def compare(shapes: list[tuple[int, int]], copy_gbps: float, device: torch.device,
            rows: tuple[int, ...] = ROWS) -> list[dict[str, Any]]:
    results = []
    for n, k in shapes:
        w = torch.randn(n, k, dtype=torch.bfloat16, device=device) * 0.02
        probe = torch.randn(256, k, dtype=torch.bfloat16, device=device)
        ours_ok = invariant(partial(_ours, w=w), probe)
        cublas_ok = invariant(partial(F.linear, weight=w), probe)
        for m in rows:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
            ours = timed(graphed(partial(_ours, x, w)), 20, device)
            theirs = timed(graphed(partial(F.linear, x, w)), 20, device)
            moved = (n * k + m * k + m * n) * 2
            results.append({
                "n": n, "k": k, "rows": m, "ours_us": ours * 1e6, "cublas_us": theirs * 1e6,
                "ours_over_cublas": ours / theirs, "ours_copy_fraction": moved / ours / 1e9 / copy_gbps,
                "cublas_copy_fraction": moved / theirs / 1e9 / copy_gbps,
                "ours_tflops": 2 * m * n * k / ours / 1e12, "cublas_tflops": 2 * m * n * k / theirs / 1e12,
                "ours_invariant": ours_ok, "cublas_invariant": cublas_ok,
            })
            r = results[-1]
            print(f"gemm {n}x{k} rows {m}: ours {r['ours_us']:.1f} us "
                  f"({r['ours_copy_fraction']:.0%} of copy, {r['ours_tflops']:.0f} TFLOP/s), "
                  f"cuBLAS {r['cublas_us']:.1f} us "
                  f"({r['cublas_copy_fraction']:.0%}, {r['cublas_tflops']:.0f}); "
                  f"invariant: ours {ours_ok}, cuBLAS {cublas_ok}", flush=True)
        del w, probe
    return results

"""The ceilings a benchmark is judged against, measured on this device, and the traffic of a step.

A decode step must at least read every weight it uses once, read each lane's K/V rows, and read
and write each lane's GDN states and conv tails; the roofline time of a step is those bytes over
the device's measured copy bandwidth (bytes read plus bytes written per second), with weights
counted as held (FP8 ones at a byte an element, ``tfd.shapes.Sizes``). Prefill is judged by FLOPs
against the measured bf16 matrix-product rate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from tfd.families.config import LINEAR, HybridConfig
from tfd.model.parallel import Parallel
from tfd.shapes import Sizes


def timed(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Median seconds of ``fn`` over ``repeats`` runs after two warm-ups (CUDA events on a GPU)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if device.type != "cuda":
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
            continue
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def copy_gbps(device: torch.device, gib: float = 2.0) -> float:
    """Device-to-device copy rate in GB/s, bytes read and written both counted."""
    source = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    seconds = timed(lambda: target.copy_(source), 10, device)
    return 2 * gib * 2**30 / seconds / 1e9


def matmul_tflops(device: torch.device, size: int = 8192, dtype: torch.dtype = torch.bfloat16) -> float:
    """Matrix product rate (cuBLAS on a GPU, random data) in TFLOP/s."""
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    seconds = timed(lambda: a @ b, 10, device)
    return 2 * size**3 / seconds / 1e12


def reduce_seconds(parallel: Parallel, rows: int, width: int, count: int, dtype: torch.dtype,
                   device: torch.device) -> float:
    """Median seconds of ``count`` sums of a [rows, width] partial over ``parallel``'s ranks, one after
    another (a decode step's: two a layer), timed alone; every rank must call it at the same point."""
    partial = torch.zeros(rows, width, dtype=dtype, device=device)
    return timed(lambda: [parallel.reduce(partial) for _ in range(count)], 5, device)


def expected_experts(experts: int, top_k: int, rows: int) -> float:
    """Distinct experts that ``rows`` rows choosing ``top_k`` each touch, on average (uniform)."""
    return experts * (1.0 - (1.0 - top_k / experts) ** rows)


def decode_bytes(cfg: HybridConfig, weights: Sizes, lanes: int, context: float, element: int = 2) -> float:
    """Bytes a decode step of ``lanes`` lanes at mean ``context`` rows must move at least, its
    activations, rows and embeddings in elements of ``element`` bytes.

    Weights: everything but the lookup tables (the embedding's one row a lane, untied; Flash Next's
    n-gram table's rows a lane's token looks up) and, for MoE, the experts no row chose (counted by
    the uniform expectation), as held (FP8 ones a byte an element with their scales); K/V rows read;
    GDN states and conv tails read and written. A tied embedding is the head's weight: read whole.
    """
    layers = cfg.layer_types
    attention = sum(1 for kind in layers if kind != LINEAR)
    gdn = len(layers) - attention
    embed = 0 if cfg.tie_embeddings else cfg.vocab * cfg.hidden * element
    used = float(weights.bytes - embed + lanes * cfg.hidden * element)
    used -= weights.table_bytes - lanes * weights.table_token_bytes
    if cfg.experts:
        moe_layers = len(layers) - len(cfg.dense_layers)
        unused = cfg.experts - expected_experts(cfg.experts, cfg.top_k, lanes)
        used -= moe_layers * unused * weights.expert_bytes
    kv = attention * 2 * cfg.kv_heads * cfg.head_dim * element * context * lanes
    state = gdn * cfg.value_heads * cfg.key_dim * cfg.value_dim * 4
    channels = 2 * cfg.key_heads * cfg.key_dim + cfg.value_heads * cfg.value_dim
    tail = gdn * (cfg.conv_kernel - 1) * channels * element
    return used + kv + 2 * lanes * (state + tail)


def prefill_flops(cfg: HybridConfig, weights: Sizes, tokens: int) -> float:
    """FLOPs of a prefill of ``tokens`` rows: 2 per active weight per row, plus causal attention
    (QK^T and PV over half the square) and the GDN chunk products (about 4 per state element a row).
    The head counts once: only the last row draws a token, so only it needs logits."""
    head = cfg.vocab * cfg.hidden
    active = weights.params - head - weights.table_params  # the embedding and n-gram table are lookups
    if not cfg.tie_embeddings:
        active -= head
    if cfg.experts:
        moe_layers = len(cfg.layer_types) - len(cfg.dense_layers)
        active -= moe_layers * (cfg.experts - cfg.top_k) * 3 * cfg.expert_inner * cfg.hidden
    attention = sum(1 for kind in cfg.layer_types if kind != LINEAR)
    gdn = len(cfg.layer_types) - attention
    attend = attention * 2 * 2 * cfg.heads * cfg.head_dim * tokens * tokens / 2
    rule = gdn * 4 * cfg.value_heads * cfg.key_dim * cfg.value_dim * tokens
    return 2 * active * tokens + 2 * head + attend + rule


def gpu_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def fraction(achieved: float, ceiling: float) -> float:
    return achieved / ceiling if ceiling and not math.isnan(ceiling) else float("nan")

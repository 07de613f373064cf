"""``tfd bench``: load or draw a model, run workloads, print a line and write a JSON file per run.

Each run object holds the shape, the workload, prefill and decode speeds, time to first token,
step time, peak memory, the bytes a decode step must move, the measured copy bandwidth and
matrix-product rate of this device, and the fractions of those ceilings reached.
"""

from __future__ import annotations

import datetime
import json
import logging
import statistics
from pathlib import Path
from typing import Any

import attrs
import torch

from tfd.bench import roofline
from tfd.bench.compare_hf import hf_model, run_hf
from tfd.bench.serve_record import revision as git_revision
from tfd.bench.workload import Timings, Workload, run
from tfd.families.hybrid import HybridModel
from tfd.model.fp8 import holds_fp8
from tfd.model.parallel import Parallel
from tfd.models import check_fp8_device
from tfd.shapes import Shape, Sizes, fit, sizes, weight_budget

log = logging.getLogger("tfd.bench")


@attrs.frozen
class Ceilings:
    copy_gbps: float
    matmul_tflops: float
    gpu: str


def measure_ceilings(device: torch.device) -> Ceilings:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    size = 8192 if device.type == "cuda" else 1024
    gib = 2.0 if device.type == "cuda" else 0.25
    return Ceilings(roofline.copy_gbps(device, gib), roofline.matmul_tflops(device, size, dtype),
                    roofline.gpu_name(device))


def random_model(name: str, device: torch.device, seed: int = 0, head: bool = False, fp8: bool = False,
                 parallel: Parallel | None = None) -> tuple[HybridModel, Shape]:
    """Shape ``name`` cut to fit this device (under tensor parallel, the ranks' devices together), its
    weights drawn there (``parallel``: this rank's share); ``head`` adds an MTP head (its drafts are a
    random head's: they measure a round's cost, not acceptance); ``fp8``: the weights Qwen's -FP8
    releases hold in FP8 drawn so."""
    if fp8:
        check_fp8_device(device, name)
    shape = fit(name, weight_budget(device) * (1 if parallel is None else parallel.size), fp8)
    if shape.cut:
        print(f"tfd bench: cut {shape.cut}")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = HybridModel.random(shape.family, shape.config, seed, dtype, device, head, fp8, parallel)
    if parallel is not None:  # the roofline counts what this rank holds
        shape = attrs.evolve(shape, sizes=sizes(shape.family, shape.config, fp8=fp8, parallel=parallel))
    return model, shape


def describe(model: HybridModel, shape_name: str, weights: Sizes, workload: Workload, timings: Timings,
             ceilings: Ceilings, revision: str, reduce_s: float | None = None) -> dict[str, Any]:
    """One run object of the JSON output; ``reduce_s``: under tensor parallel, a decode step's sums
    over the ranks timed alone (its roofline fraction is then also given without them)."""
    cfg, streams = model.cfg, workload.streams
    step_s = timings.decode_s / timings.decode_steps if timings.decode_steps else float("nan")
    # a stream's time a token: a step's time when every step gives each stream one (no drafts)
    token_s = timings.decode_s * streams / timings.decode_tokens if timings.decode_tokens else float("nan")
    context = workload.prompt_tokens + workload.new_tokens / 2  # mean rows a lane holds while decoding
    moved = roofline.decode_bytes(cfg, weights, streams, context)
    floor_s = moved / (ceilings.copy_gbps * 1e9)
    prompt = streams * workload.prompt_tokens
    prefill_flops = streams * roofline.prefill_flops(cfg, weights, workload.prompt_tokens)
    return {
        "shape": shape_name, "family": cfg.family, "layers": cfg.layers,
        "dtype": str(model.dtype).split(".")[-1], "weights": "fp8" if holds_fp8(model.weights) else "float",
        "streams": streams, "prompt_tokens": workload.prompt_tokens, "new_tokens": workload.new_tokens,
        "prefill_tok_s": prompt / timings.prefill_s,
        "time_to_first_token_s": {"min": min(timings.first_token_s), "max": max(timings.first_token_s)},
        "decode_tok_s": streams / token_s, "decode_tok_s_per_stream": 1 / token_s,
        "time_per_output_token_ms": tpot_of(workload, timings),
        "step_ms": step_s * 1e3, "decode_steps": timings.decode_steps, "cuda_graphs": timings.graphs,
        "bytes_per_step": moved, "roofline_step_ms": floor_s * 1e3,
        "roofline_tok_s": streams / floor_s, "roofline_fraction": floor_s / token_s,
        "temperature": workload.temperature, "text_prompts": workload.prompts is not None,
        "grammar": workload.grammar_name,
        **_drafting(workload, timings),
        "prefill_tflops": prefill_flops / timings.prefill_s / 1e12,
        "matmul_fraction": prefill_flops / timings.prefill_s / 1e12 / ceilings.matmul_tflops,
        "copy_gbps": ceilings.copy_gbps, "matmul_tflops": ceilings.matmul_tflops,
        "peak_memory_gib": timings.peak_bytes / 2**30, "weight_gib": weights.bytes / 2**30,
        "gpu": ceilings.gpu, "torch": torch.__version__, "commit": revision,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        **_parallel(model, floor_s, token_s, reduce_s),
    }


def _parallel(model: HybridModel, floor_s: float, token_s: float, reduce_s: float | None) -> dict[str, Any]:
    """A run's tensor parallel size and, above one, its step's sums alone and the roofline without them
    (the roofline: one rank's bytes over one card's copy rate)."""
    parallel = model.weights.parallel
    if parallel is None or reduce_s is None:
        return {"tensor_parallel": 1}
    return {"tensor_parallel": parallel.size, "reduce_ms": reduce_s * 1e3,
            "roofline_fraction_without_reduce": floor_s / (token_s - reduce_s) if token_s > reduce_s
            else float("nan")}


def tpot_of(workload: Workload, timings: Timings) -> dict[str, float] | None:
    """Each stream's time a token after its first, (last - first) / (tokens - 1), as an HTTP client
    measures it: in a burst it holds the waits for other streams' prompt chunks, which the decode
    step does not. Mean and max over the streams; None for streams of one token."""
    if workload.new_tokens < 2 or not timings.last_token_s:
        return None
    each = [(last - first) * 1e3 / (workload.new_tokens - 1)
            for first, last in zip(timings.first_token_s, timings.last_token_s, strict=True)]
    return {"mean": sum(each) / len(each), "max": max(each)}


def _drafting(workload: Workload, timings: Timings) -> dict[str, Any]:
    """A run's drafting: drafts a round at most, the confidence cut, and what the rounds gave."""
    if workload.drafting is None:
        return {"drafts": 0}
    counts = timings.drafts
    return {"drafts": workload.drafting.most, "confidence": workload.drafting.confidence,
            "max_lanes": workload.drafting.max_lanes,
            "rounds": counts.rounds, "drafted": counts.drafted, "accepted": counts.accepted,
            "acceptance": counts.rate, "tokens_per_round": (counts.rounds + counts.accepted) / counts.rounds
            if counts.rounds else None}


def line(result: dict[str, Any]) -> str:
    return (f"{result['shape']} x{result['streams']} prompt {result['prompt_tokens']} "
            f"new {result['new_tokens']}: "
            f"prefill {result['prefill_tok_s']:.0f} tok/s ({result['matmul_fraction']:.1%} of matmul), "
            f"decode {result['decode_tok_s']:.1f} tok/s ({result['decode_tok_s_per_stream']:.1f}/stream, "
            f"step {result['step_ms']:.2f} ms, {result['roofline_fraction']:.1%} of roofline "
            f"{result['roofline_step_ms']:.2f} ms), peak {result['peak_memory_gib']:.1f} GiB"
            + (f", grammar {result['grammar']}" if result.get("grammar", "none") != "none" else "")
            + (f", tensor parallel {result['tensor_parallel']} (sums {result['reduce_ms']:.2f} ms a step; "
               f"{result['roofline_fraction_without_reduce']:.1%} without)" if "reduce_ms" in result else "")
            + (f", {result['drafts']} drafts: acceptance {result['acceptance'] or 0:.1%}, "
               f"{result['tokens_per_round'] or 0:.2f} tokens a round" if result["drafts"] else ""))


def bench(model: HybridModel, shape_name: str, weights: Sizes, workloads: list[Workload], graphs: bool,
          revision: str | None = None, rounds: int = 1) -> list[dict[str, Any]]:
    """Run each workload on ``model``, all of them in turn each of ``rounds`` rounds (round r cuts its
    prompts with seed r, so every workload of a round reads the same prompts); print a line each;
    the run objects, round by round."""
    device = model.weights.embed.device
    ceilings = measure_ceilings(device)
    print(f"tfd bench: {ceilings.gpu}: copy {ceilings.copy_gbps:.0f} GB/s, "
          f"matmul {ceilings.matmul_tflops:.0f} TFLOP/s")
    revision = revision or git_revision()
    parallel = model.weights.parallel
    results = []
    for round_ in range(rounds):
        for workload in workloads:
            # untimed first, at the same streams: Triton compiles a kernel per shape class on first use
            # (32 lanes' prompt rows compiled 6 s into the timed prefill when the warm-up ran one)
            warm = attrs.evolve(workload, new_tokens=2)
            run(model, warm, graphs, seed=rounds + 1)
            timings = run(model, workload, graphs, seed=round_)
            # every rank times the same sums at the same point: collectives meet in order
            reduce_s = None if parallel is None else roofline.reduce_seconds(
                parallel, workload.streams, model.cfg.hidden, 2 * model.cfg.layers, model.dtype, device)
            result = describe(model, shape_name, weights, workload, timings, ceilings, revision, reduce_s)
            result["round"] = round_
            print(line(result), flush=True)
            results.append(result)
    return results


def summary(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per run name over its rounds: the median, least and most decode tok/s and, with drafts, the
    acceptance and tokens a round of all its rounds' drafts together."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        runs.setdefault(run_name({**result, "round": 0}), []).append(result)
    found = []
    for name, group in runs.items():
        speeds = sorted(result["decode_tok_s"] for result in group)
        entry: dict[str, Any] = {"run": name, "runs": len(group),
                                 "decode_tok_s_median": statistics.median(speeds),
                                 "decode_tok_s_min": speeds[0], "decode_tok_s_max": speeds[-1]}
        if group[0].get("drafts"):
            drafted = sum(result["drafted"] for result in group)
            accepted = sum(result["accepted"] for result in group)
            verified = sum(result["rounds"] for result in group)
            entry.update(acceptance=accepted / drafted if drafted else None,
                         tokens_per_round=(verified + accepted) / verified if verified else None)
        found.append(entry)
        print(f"{name}: {len(group)} rounds, decode median {entry['decode_tok_s_median']:.1f} tok/s "
              f"({speeds[0]:.1f} to {speeds[-1]:.1f})"
              + (f", acceptance {entry['acceptance'] or 0:.1%}" if "acceptance" in entry else ""), flush=True)
    return found


def run_name(result: dict[str, Any]) -> str:
    """``<shape>-<streams>x<prompt>-<new>[-d<drafts>][-<grammar>][-r<round>]``: a run's files are named
    after it."""
    drafts = f"-d{result['drafts']}" if result.get("drafts") else ""
    grammar = f"-{result['grammar']}" if result.get("grammar", "none") != "none" else ""
    again = f"-r{result['round']}" if result.get("round") else ""
    return (f"{result['shape']}-{result['streams']}x{result['prompt_tokens']}-{result['new_tokens']}"
            f"{drafts}{grammar}{again}")


def write(results: list[dict[str, Any]], out: Path) -> None:
    """One file a run: ``out/<run_name>.json``."""
    out.mkdir(parents=True, exist_ok=True)
    for result in results:
        (out / f"{run_name(result)}.json").write_text(json.dumps(result, indent=2) + "\n")


def compare_hf(results: list[dict[str, Any]], workloads: list[Workload], config: dict[str, Any],
               dtype: torch.dtype, device: torch.device) -> None:
    """transformers on the same shape and workloads; adds its speeds and tfd's ratio to each run."""
    model = hf_model(config, dtype, device)
    for result, workload in zip(results, workloads, strict=True):
        timings = run_hf(model, int(config["vocab_size"]), workload)
        hf_tok_s = timings.decode_tok_s(workload)
        prefill = workload.streams * workload.prompt_tokens / timings.prefill_s
        result.update(hf_decode_tok_s=hf_tok_s, hf_prefill_tok_s=prefill, hf_fla=timings.fla,
                      tfd_over_hf=result["decode_tok_s"] / hf_tok_s)
        print(f"transformers{' + fla' if timings.fla else ''} x{workload.streams}: decode {hf_tok_s:.1f} "
              f"tok/s; tfd is {result['tfd_over_hf']:.2f}x", flush=True)

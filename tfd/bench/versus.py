"""``tfd bench --serve URL --compare-engine --shape NAME``: the HTTP runs against the engine bench.

After the HTTP runs, the engine bench (``tfd.bench.main.bench``) runs in this process on ``--shape``
with random weights, a workload per closed-loop run's concurrency (streams = C, the middle of the
runs' prompt and new ranges, random prompt ids even for ``--text``, the same temperature,
``--drafts`` N as the requests' drafting, TF_MTP_MAX_LANES as this environment says), and each
concurrency run is set against it (``versus``):

- ``tpot_ratio``: the run's mean TPOT over the engine's time a token a stream (its decode step
  without drafts). Gate: at most 1.05 at one stream, 1.15 when all requests go at once (N == C);
- ``burst_tpot_ratio``: the run's mean TPOT over the engine's, measured alike (each stream's last
  token less its first over its tokens less one), printed beside: when a burst's prompts do not fit
  one step, a stream's TPOT holds its waits for the prompt chunks of the streams admitted after it,
  which no decode step does (at 32 prompts of 1,024 tokens and 256 new ones in 8,192-row steps,
  about half the burst's prefill over 255 tokens: 1.24-1.31x the step on the 9B shape); this ratio
  says how much of a miss is the HTTP path's and how much the step's rows';
- ``ttft_ratio``: the run's largest TTFT over the engine's. Gate, all at once: at most 1.2;
- ``throughput_ratio``: the run's output tok/s over what the engine's rates allow for the same work,
  ``T = prompt tokens / prefill tok/s + output tokens / decode tok/s at C``, ``allowed = output / T``.
  Gate, each finished request replaced (N > C): at least 0.9;
- ``tail_ratio``: the run's TPOT p99 over its p50. Gate, N > C: under 2.

Only ``compare`` imports torch. Resource handling: the engine's model is drawn after the HTTP runs,
beside whatever the server holds on the device; an out-of-memory there is said plainly (the server
should be started with ``TF_CUDA_MEMORY_LIMIT_GB`` leaving room), the HTTP runs already written.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

TPOT_ONE = 1.05  # one stream: the HTTP path's token time over the engine's step, at most
TPOT_BURST = 1.15  # all requests at once: over the engine's step too
TTFT_BURST = 1.2  # all requests at once: the slowest first token over the engine's slowest
THROUGHPUT = 0.9  # each finished request replaced: the share of the engine's work model, at least
TAIL = 2.0  # each finished request replaced: TPOT p99 over p50, under


@attrs.frozen
class EngineRun:
    """What the comparison reads from an engine bench run (``tfd.bench.main.describe``'s object)."""

    streams: int
    drafts: int
    step_ms: float
    token_ms: float  # a stream's time a token: the step without drafts, less with accepted drafts
    ttft_max_s: float
    prefill_tok_s: float
    decode_tok_s: float
    tpot_ms: float | None  # the streams' mean time a token after their first, as a client measures it

    @classmethod
    def of(cls, result: Mapping[str, Any]) -> EngineRun:
        tpot = result.get("time_per_output_token_ms")
        return cls(result["streams"], result.get("drafts") or 0, result["step_ms"],
                   1e3 / result["decode_tok_s_per_stream"], result["time_to_first_token_s"]["max"],
                   result["prefill_tok_s"], result["decode_tok_s"], tpot["mean"] if tpot else None)


@attrs.frozen
class Versus:
    """An HTTP run's ratios to the engine's, and the gates that apply to its kind of run."""

    tpot_ratio: float
    burst_tpot_ratio: float
    ttft_ratio: float
    allowed_tok_s: float
    throughput_ratio: float
    tail_ratio: float
    gates: dict[str, bool]  # gate name: held

    def as_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


def allowed_tok_s(prompt_tokens: int, output_tokens: int, prefill_tok_s: float, decode_tok_s: float) -> float:
    """Output tok/s the engine's rates allow for the work: every prompt prefilled at ``prefill_tok_s``,
    then every output token at ``decode_tok_s``, one after the other."""
    seconds = prompt_tokens / prefill_tok_s + output_tokens / decode_tok_s
    return output_tokens / seconds


def versus(run: Mapping[str, Any], engine: EngineRun) -> Versus:
    """``run`` (a concurrency run's JSON object) against ``engine`` at its concurrency."""
    tpot, ttft = run["tpot_ms"], run["ttft_ms"]
    allowed = allowed_tok_s(run["prompt_tokens_total"], run["output_tokens_total"], engine.prefill_tok_s,
                            engine.decode_tok_s)
    tpot_ratio, burst_tpot_ratio = _ratio(tpot["mean"], engine.token_ms), _ratio(tpot["mean"], engine.tpot_ms)
    ttft_ratio = _ratio(ttft["max"], engine.ttft_max_s * 1e3)
    throughput_ratio, tail_ratio = _ratio(run["output_tok_s"], allowed), _ratio(tpot["p99"], tpot["p50"])
    gates = {}
    burst = run["requests"] == run["concurrency"]
    if run["concurrency"] == 1:
        gates["tpot"] = tpot_ratio <= TPOT_ONE
    elif burst:
        gates["tpot"] = tpot_ratio <= TPOT_BURST
    if burst:
        gates["ttft_max"] = ttft_ratio <= TTFT_BURST
    else:
        gates["throughput"] = throughput_ratio >= THROUGHPUT
        gates["tpot_tail"] = tail_ratio < TAIL
    return Versus(tpot_ratio, burst_tpot_ratio, ttft_ratio, allowed, throughput_ratio, tail_ratio, gates)


def _ratio(a: float | None, b: float | None) -> float:
    return a / b if a is not None and b else float("nan")


def table(rows: Sequence[tuple[str, EngineRun, Versus]]) -> str:
    """The ratios a run, each applicable gate marked held (ok) or not (MISS): TPOT over the engine's
    step gated at one stream and when all go at once, over the engine's TPOT measured alike printed."""
    def mark(found: Versus, gate: str, value: float) -> str:
        held = found.gates.get(gate)
        return f"{value:.3f}" + ("" if held is None else " ok" if held else " MISS")

    lines = [f"{'run':48} {'engine ms/token':>15} {'TPOT/step':>11} {'TPOT/engine':>13} "
             f"{'TTFTmax/engine':>15} {'tok/s/allowed':>14} {'TPOT p99/p50':>13}"]
    for name, engine, found in rows:
        lines.append(f"{name:48} {engine.token_ms:>15.3f} {mark(found, 'tpot', found.tpot_ratio):>11} "
                     f"{found.burst_tpot_ratio:>13.3f} "
                     f"{mark(found, 'ttft_max', found.ttft_ratio):>15} "
                     f"{mark(found, 'throughput', found.throughput_ratio):>14} "
                     f"{mark(found, 'tpot_tail', found.tail_ratio):>13}")
    return "\n".join(lines)


def compare(runs: Sequence[dict[str, Any]], shape: str, args: Any, max_lanes: int, out: Path | None,
            commit: str, fp8: bool = False) -> int:
    """The engine bench at each concurrency run's shape (``fp8``: its weights drawn in FP8, as a server
    started with TF_DTYPE=fp8 draws them), then the table; each run's object gains an ``engine``
    block (rewritten under ``out``). The exit status: 1 when the engine could not run."""
    import torch

    from tfd.bench.main import bench, random_model, run_name
    from tfd.bench.main import write as write_engine
    from tfd.bench.serve_record import run_name as serve_name
    from tfd.bench.serve_record import write
    from tfd.bench.workload import Workload
    from tfd.engine.runner import Drafting

    closed = [run for run in runs if run["mode"] == "concurrency"]
    keys = sorted({(run["concurrency"], _mean(run["prompt_tokens"]), _mean(run["new_tokens"]),
                    run["drafts"] if run["draft"] else 0) for run in closed})
    temperature = closed[0]["temperature"]  # every run of a call draws alike
    workloads = [Workload(c, prompt, new, args.step_tokens,
                          Drafting(drafts, args.confidence, max_lanes) if drafts else None, temperature)
                 for c, prompt, new, drafts in keys]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        model, drawn = random_model(shape, device, head=any(key[3] for key in keys), fp8=fp8)
        results = bench(model, drawn.name, drawn.sizes, workloads, not args.no_graphs, commit)
    except torch.OutOfMemoryError:
        free, total = torch.cuda.mem_get_info(device) if device.type == "cuda" else (0, 0)
        print(f"tfd bench --compare-engine: the engine bench ran out of device memory ({free / 2**30:.1f} of "
              f"{total / 2**30:.1f} GiB free now): the server holds the rest. Start the server with "
              f"TF_CUDA_MEMORY_LIMIT_GB leaving room for {shape}'s weights and pool, or run `tfd bench "
              f"--shape {shape}` with the server stopped. The HTTP runs are written.", file=sys.stderr)
        return 1
    except ValueError as error:  # a shape that does not fit the device
        print(f"tfd bench --compare-engine: {error}", file=sys.stderr)
        return 1
    if out is not None:
        write_engine(results, out)
    engines = {key: EngineRun.of(result) for key, result in zip(keys, results, strict=True)}
    rows = []
    for run in closed:
        key = (run["concurrency"], _mean(run["prompt_tokens"]), _mean(run["new_tokens"]),
               run["drafts"] if run["draft"] else 0)
        engine, found = engines[key], versus(run, engines[key])
        run["engine"] = {"shape": drawn.name, "run": run_name(results[keys.index(key)]),
                         "step_tokens": args.step_tokens, **attrs.asdict(engine), **found.as_json()}
        if run["draft"] is None and run["drafted"]:
            print(f"tfd bench: {serve_name(run)}: the server drafted, the engine did not; --drafts N "
                  "compares like with like", file=sys.stderr)
        rows.append((serve_name(run), engine, found))
        if out is not None:
            write(run, out)
    # a server prefills TF_STEP_TOKENS rows a step (32768 on a large GPU by default): at another count than
    # the engine's, its first tokens and the decode steps beside prompt chunks differ by that alone
    print(f"engine: {drawn.name}, {args.step_tokens} rows a step (--step-tokens; the server's is its "
          f"TF_STEP_TOKENS)\n{table(rows)}", flush=True)
    return 0


def _mean(span: Sequence[int]) -> int:
    """The engine's one length for a run's range: its middle."""
    return round(sum(span) / len(span))

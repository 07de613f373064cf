"""``tfd bench``'s command line: the engine bench's flags and ``--serve``'s, and their value types.

Kept apart from ``tfd.cli`` (which builds every other command) because it is the largest; nothing
here imports torch.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tfd.arguments import counts, draft_counts, natural, positive, positive_float, rates, span
from tfd.bench.defaults import STEP_TOKENS
from tfd.env import Table


def add_bench_parser(commands: Any, table: Table, run: Callable[..., int]) -> argparse.ArgumentParser:
    """The ``bench`` subcommand on ``commands`` (argparse's subparsers), calling ``run``."""
    bench = commands.add_parser(
        "bench", help="speed against the device's memory roofline, or of a running server",
        description="Run workloads through the engine's scheduler and runner; print a line and write "
        "a JSON file per run (prefill and decode speed, time to first token, step time, peak memory, "
        "bytes a decode step moves, measured copy bandwidth, roofline fraction). With --serve URL, load "
        "a running tfd through its HTTP API instead (streamed completions of token ids): a line and a "
        "JSON file per run (requests, errors by kind, output tok/s, TTFT, TPOT and inter-token latency "
        "at p50/p90/p99); no torch, no GPU needed on this side.")
    bench.add_argument("--random-weights", action="store_true",
                       help="with a checkpoint: draw its weights at random (implied by --shape)")
    bench.add_argument("--streams", type=counts, metavar="N[,N...]",
                       help="concurrent streams, one run each (default 1)")
    bench.add_argument("--prompt", type=span, metavar="N",
                       help="prompt tokens (1024); with --serve also LOW:HIGH, each request's drawn "
                       "uniformly")
    bench.add_argument("--new", type=span, metavar="N",
                       help="new tokens a stream (256); with --serve also LOW:HIGH")
    bench.add_argument("--step-tokens", type=positive, default=STEP_TOKENS, metavar="N",
                       help=f"rows a step may run ({STEP_TOKENS}, the daemon's on a large GPU)")
    bench.add_argument("--no-graphs", action="store_true", help="decode steps eagerly, no CUDA graphs")
    bench.add_argument("--drafts", type=draft_counts, metavar="N[,N...]",
                       help="MTP drafts a round at most, one run each (0: no drafting; default 0); a --shape "
                       "then gets a random MTP head; as in the daemon, no stream drafts past "
                       "TF_MTP_MAX_LANES. With --serve: 0 sends \"draft\": false, N sends true (give the "
                       "server's TF_MTP_DRAFTS: --compare-engine's engine drafts N); default: the server's")
    bench.add_argument("--grammar", type=grammars, default=["none"], metavar="G[,G...]",
                       help="none or json, one run each: json makes every stream follow a JSON Schema's "
                       "grammar (records of strings, integers, enums and lists, as many as the stream has "
                       "tokens), its masks filled and applied each step as the daemon does")
    bench.add_argument("--tokenizer", type=Path, metavar="FILE",
                       help="the tokenizer.json --grammar compiles against (default: the checkpoint's; a "
                       "--shape's: the demo's with an entry for every other id, as tfd serve --shape has)")
    bench.add_argument("--confidence", type=float, default=0.7, metavar="P",
                       help="chain a further draft while the one before is at least this likely (0.7)")
    bench.add_argument("--temperature", type=float, metavar="T",
                       help="sampling temperature, keyed (1.0; with --serve 0; 0: greedy)")
    bench.add_argument("--text", action="store_true",
                       help="prompts cut from the held-out files of the demo's training text (Python's "
                       "standard library) with the checkpoint's tokenizer (with --serve: the server's "
                       "/tokenize), not random tokens")
    bench.add_argument("--profile", action="store_true",
                       help="after each run, profile its prefill and its decode steps kernel by kernel "
                       "(written beside the JSON as <run>-prefill.txt and <run>-decode.txt, or printed)")
    bench.add_argument("--compare-hf", action="store_true",
                       help="then run transformers (with fla-core's kernels when installed) on the same "
                       "shape and workloads in this process, and report tfd's speed over its")
    bench.add_argument("--gemm", action="store_true",
                       help="instead of workloads: the batch-invariant GEMM against cuBLAS at the model's "
                       "weight shapes (CUDA only)")
    bench.add_argument("--variant", type=variant, action="append", metavar="NAME=tfd_kernels.M.C=V[,...]",
                       help="instead of one run a workload: module constants (tfd_kernels, tfd.model, "
                       "tfd.engine) compared in this process, runs of the variants interleaved, tokens "
                       "compared with the first's (repeat per variant; NAME= for the defaults)")
    bench.add_argument("--rounds", type=positive, metavar="N",
                       help="runs of each workload, all workloads in turn each round, round r cutting "
                       "its prompts with seed r; a summary of each over its rounds (1); or runs of each "
                       "variant (2); a run's files get -r<round> past the first")
    bench.add_argument("--conversation", action="store_true",
                       help="instead of workloads: a conversation's second turn after a restart, its state "
                       "read back from disk (learned), against the same turn prefilled cold: time to first "
                       "token of each, bytes read and the read bandwidth (--prompt: the first turn's "
                       "tokens); with --streams N (N > 1), turn two read back while N - 1 streams decode: "
                       "their time between tokens during the read against before it, and its first token")
    bench.add_argument("--serve", metavar="URL",
                       help="instead of the engine: load the tfd at URL (http://host:port) through its API, "
                       "streamed /v1/completions of token ids with ignore_eos; one run a --concurrency and "
                       "a --rate (engine-only flags refused)")
    serve = bench.add_argument_group("--serve runs")
    serve.add_argument("--concurrency", type=counts, metavar="C[,C...]",
                       help="closed loop: C clients, each sending its next request when its last ended, one "
                       "run each (default 1 without --rate); --requests C sends all at once")
    serve.add_argument("--rate", type=rates, metavar="R[,R...]",
                       help="open loop: requests a second at Poisson arrival times (seeded), one run each")
    serve.add_argument("--requests", type=positive, metavar="N",
                       help="requests a run (closed loop: max(4 C, 8); open loop: max(16, 10 R))")
    serve.add_argument("--no-warm", action="store_true",
                       help="no untimed warm round (C requests, open loop 8, at most 4 new tokens) before "
                       "a run")
    serve.add_argument("--seed", type=natural, metavar="S",
                       help="seed of the lengths, prompt ids and arrival times (0)")
    serve.add_argument("--no-drafts", action="store_true", help="every request says \"draft\": false")
    serve.add_argument("--cache", action="store_true",
                       help="leave the server's prompt cache in play (default: \"cache\": false, every "
                       "prompt prefilled cold, as the engine bench does)")
    serve.add_argument("--api-key", metavar="KEY", help="a key of the server's TF_API_KEYS")
    serve.add_argument("--timeout", type=positive_float, metavar="S",
                       help="seconds a request may take, stream included (600); past it, an error")
    serve.add_argument("--write-conversation", type=Path, metavar="FILE",
                       help="instead of runs: a conversation's turn one (--prompt ids, --new tokens, greedy, "
                       "the prompt cache in play), written to FILE for --resume-conversation after the "
                       "server restarts (a server with TF_LEARN_CONVERSATIONS=1 keeps its state on disk)")
    serve.add_argument("--resume-conversation", type=Path, metavar="FILE",
                       help="instead of runs: FILE's turn two (--write-conversation's) sent while "
                       "--concurrency C minus one other streams decode: their time a token while it waits "
                       "for its first token against before and after, its first token against the "
                       "server's read time plus its new tokens' alone and cold, its tokens against the "
                       "same turn sent cold")
    serve.add_argument("--compare-engine", action="store_true",
                       help="after the HTTP runs, the engine bench on --shape (TF_SHAPE: the server's shape, "
                       "random weights) in this process at each --concurrency's streams and lengths, and "
                       "a table of ratios: TPOT over the engine's step, TTFT max over its, tok/s over what "
                       "its prefill and decode rates allow (--step-tokens: give the server's TF_STEP_TOKENS "
                       "to compare like with like). It needs room on the device beside the server: start "
                       "the server with TF_CUDA_MEMORY_LIMIT_GB leaving it")
    bench.add_argument("--tensor-parallel", type=positive, metavar="N",
                       help="run on N ranks, one process a GPU (CPU processes without one), the model "
                       "split as tfd serve --tensor-parallel N splits it; each run adds a step's sums over "
                       "the ranks timed alone and its roofline fraction without them")
    bench.add_argument("--out", type=Path, metavar="DIR", help="write one JSON file per run here")
    bench.add_argument("--commit", help="the revision to record (default: git's HEAD)")
    table.add_flags(bench, scopes=("core",))
    bench.set_defaults(command=run)
    return bench


def variant(text: str) -> Any:
    """``NAME=tfd_kernels.MODULE.CONSTANT=VALUE[,...]`` (``tfd.bench.variants.parse``)."""
    from tfd.bench.variants import parse

    try:
        return parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def grammars(text: str) -> list[str]:
    """``G[,G...]``, each none or json (``tfd bench --grammar``)."""
    found = text.split(",")
    for name in found:
        if name not in ("none", "json"):
            raise argparse.ArgumentTypeError(f"a grammar is none or json, got {name!r}")
    return found

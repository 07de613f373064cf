"""``tfd bench``'s body: the model it loads or draws, the workloads it builds, and what it writes.

The command line (``tfd.cli``) parses the flags and reads the environment first, then imports this
(torch and the model code load only here).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

import tokenizers
import torch

from tfd.bench.conversation import WARM_TOKENS, conversation
from tfd.bench.gemm import compare as compare_gemm
from tfd.bench.gemm import weight_shapes
from tfd.bench.main import bench, compare_hf, measure_ceilings, random_model, run_name, summary, write
from tfd.bench.profile import profiles
from tfd.bench.read_beside import read_beside
from tfd.bench.serve_record import revision
from tfd.bench.variants import compare as compare_variants
from tfd.bench.workload import Workload
from tfd.checkpoint import CheckpointError, read_config
from tfd.engine.grammar import Grammar, Vocabulary
from tfd.engine.runner import Drafting
from tfd.env import Settings
from tfd.exit_status import EXIT_FAILURE
from tfd.model.fp8 import holds_fp8
from tfd.model.parallel import Parallel
from tfd.models import load
from tfd.server.ranks import device_of
from tfd.server.structured import json_rule
from tfd.shapes import covering_tokenizer, sizes
from tfd.train.corpus import Corpus


def run(settings: Settings, args: argparse.Namespace, parallel: Parallel | None = None) -> int:
    """``tfd bench`` with its parsed ``args`` and the environment's ``settings``: the exit status;
    ``parallel``: this process's rank (``tfd.bench.tensor_parallel``)."""
    device = device_of(torch.device("cuda" if torch.cuda.is_available() else "cpu"), parallel)
    try:
        preset = settings.optional("TF_SHAPE", str)
        if preset is not None:
            fp8 = settings.value("TF_DTYPE", str) == "fp8"
            model, shape = random_model(preset, device, head=any(args.drafts), fp8=fp8, parallel=parallel)
            name, size, config = shape.name, shape.sizes, shape.config
        else:
            loaded = load(settings, os.environ, device, args.random_weights, parallel=parallel)
            model, name, config = loaded.model, loaded.path.name, model_config(loaded.path)
            loaded_path = loaded.path
            # a checkpoint's FP8 weights counted as the -FP8 releases hold theirs; a rank's share
            size = sizes(loaded.family, config, model.dtype.itemsize, fp8=holds_fp8(model.weights),
                         parallel=parallel)
            del loaded
    except (CheckpointError, ValueError) as error:
        print(f"tfd bench: {error}", file=sys.stderr)
        return EXIT_FAILURE
    if args.gemm:
        return gemm_bench(model, name, device, args.out)
    if args.conversation:
        return conversation_bench(model, name, args, settings.value("TF_PROMPT_KEEP_GAIN", int))
    prompts = None
    if args.text:
        if preset is not None or args.random_weights:
            print("tfd bench: --text needs a checkpoint's tokenizer and trained weights", file=sys.stderr)
            return EXIT_FAILURE
        prompts = text_prompts(loaded_path)
    gate = settings.value("TF_MTP_MAX_LANES", int)  # as the daemon would: no drafts past it
    compiled = {}
    if "json" in args.grammar:
        tokenizer = args.tokenizer or (None if preset is not None else loaded_path / "tokenizer.json")
        if tokenizer is not None and not tokenizer.is_file():
            print(f"tfd bench: --grammar json: no tokenizer at {tokenizer}", file=sys.stderr)
            return EXIT_FAILURE
        # a shape's: the one `tfd serve --shape` serves it with, covering its vocabulary
        text = covering_tokenizer(model.cfg.vocab) if tokenizer is None else \
            tokenizers.Tokenizer.from_file(str(tokenizer)).to_str()
        compiled["json"] = records_grammar(text, model.cfg.vocab, model.cfg.eos or (0,), args.new)
    workloads = [Workload(n, args.prompt, args.new, args.step_tokens,
                          Drafting(most, args.confidence, gate) if most else None, args.temperature, prompts,
                          compiled.get(grammar), grammar)
                 for n in args.streams for most in args.drafts for grammar in args.grammar]
    if args.variant:
        return variant_bench(model, name, workloads, args.variant, args.rounds or 2, not args.no_graphs,
                             args.out)
    # rounds interleave the workloads, so a machine's drift reaches every one alike, and each round
    # cuts other prompts, so one stream's speed is not one prompt's
    rounds = args.rounds or 1
    results = bench(model, name, size, workloads, not args.no_graphs, args.commit, rounds)
    summaries = summary(results) if rounds > 1 else []
    if args.profile:
        profile_runs(model, results[:len(workloads)], workloads, not args.no_graphs, args.out)
    if args.compare_hf:
        dtype = model.dtype
        del model  # the two models need not fit at once
        if device.type == "cuda":
            torch.cuda.empty_cache()
        compare_hf(results[:len(workloads)], workloads, config, dtype, device)
    if args.out is not None:
        write(results, args.out)
        if summaries:
            (args.out / f"{name}-summary.json").write_text(json.dumps(summaries, indent=2) + "\n")
    return 0


def conversation_bench(model: Any, name: str, args: argparse.Namespace, keep_gain: int) -> int:
    """``--conversation``: one line and, with ``--out``, ``<name>-conversation.json``; resumed lanes
    keep states as the daemon would (``keep_gain``: TF_PROMPT_KEEP_GAIN). With ``--streams N`` (N > 1),
    turn two read back beside N - 1 decoding streams instead (``read_beside_bench``)."""
    if max(args.streams) > 1:
        return read_beside_bench(model, name, args, max(args.streams))
    found = conversation(model, args.prompt, args.new, not args.no_graphs, args.step_tokens,
                         keep_gain=keep_gain)
    found = {"shape": name, "commit": args.commit or revision(), **found}
    mib = found["bytes_read"] / 2**20
    print(f"{name} conversation of {found['prompt_tokens']} tokens: turn two ({found['turn2_prompt_tokens']} "
          f"tokens, {found['cached_tokens']} read back) first token {found['ttft_from_disk_s']:.3f} s from "
          f"disk, {found['ttft_cold_s']:.3f} s cold ({100 * found['ratio']:.1f}%); {mib:.0f} MiB read in "
          f"{found['read_s']:.3f} s; from the page cache {found['ttft_page_cache_s']:.3f} s "
          f"({100 * found['page_cache_ratio']:.1f}%, read in {found['page_cache_read_s']:.3f} s; "
          f"the host alone reads the files in {found['host_read_s']:.3f} s)")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{name}-conversation.json").write_text(json.dumps(found, indent=2) + "\n")
    return 0


def read_beside_bench(model: Any, name: str, args: argparse.Namespace, streams: int) -> int:
    """``--conversation --streams N``: turn two read back while ``streams - 1`` others decode, its
    files dropped from the page cache, then kept there; a line each and, with ``--out``,
    ``<name>-read-beside.json``."""
    # untimed first, as --conversation's: every kernel the timed rounds take compiles here
    read_beside(model, min(args.prompt, WARM_TOKENS), args.new, streams, not args.no_graphs, args.step_tokens,
                True, seed=1)
    found = []
    for page_cache in (False, True):
        result = read_beside(model, args.prompt, args.new, streams, not args.no_graphs, args.step_tokens,
                             page_cache)
        result = {"shape": name, "commit": args.commit or revision(), **result}
        where = "the page cache" if page_cache else "disk"
        print(f"{name} turn two ({result['turn2_prompt_tokens']} tokens, {result['cached_tokens']} read back "
              f"from {where}) beside {streams - 1} streams: first "
              f"token {result['ttft_s']:.3f} s, {result['ttft_over_read_and_new'] or 0:.2f}x its read "
              f"({result['read_s']:.3f} s) and new tokens cold ({result['new_tokens_cold_s']:.3f} s); the "
              f"others' time between tokens {result['others_gap_during_ms'] or 0:.2f} ms during the read, "
              f"{result['others_gap_before_ms'] or 0:.2f} ms before ({result['others_gap_ratio'] or 0:.2f}x)",
              flush=True)
        found.append(result)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{name}-read-beside.json").write_text(json.dumps(found, indent=2) + "\n")
    return 0


def text_prompts(checkpoint: Path) -> tuple[tuple[int, ...], ...]:
    """The held-out files of the demo's training text, a token tuple each."""
    held_out = Corpus.read(tokenizer=checkpoint / "tokenizer.json").validation
    ends = [0, *((held_out == 0).nonzero().flatten() + 1).tolist()]  # each file ends with <|endoftext|>
    return tuple(tuple(held_out[a:b].tolist()) for a, b in itertools.pairwise(ends) if b > a)


def profile_runs(model: Any, results: list[dict[str, Any]], workloads: list[Any], graphs: bool,
                 out: Path | None) -> None:
    for result, workload in zip(results, workloads, strict=True):
        for phase, table in profiles(model, workload, graphs).items():
            if out is None:
                print(f"== {run_name(result)} {phase}\n{table}")
            else:
                out.mkdir(parents=True, exist_ok=True)
                (out / f"{run_name(result)}-{phase}.txt").write_text(table)


def variant_bench(model: Any, name: str, workloads: list[Any], variants: list[Any], rounds: int, graphs: bool,
                  out: Path | None) -> int:
    for workload in workloads:
        results = compare_variants(model, name, workload, variants, rounds, graphs)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{run_name(results[0])}-variants.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


def gemm_bench(model: Any, name: str, device: Any, out: Path | None) -> int:
    if device.type != "cuda":
        print("tfd bench --gemm: needs a CUDA device", file=sys.stderr)
        return EXIT_FAILURE
    results = compare_gemm(weight_shapes(model.weights), measure_ceilings(device).copy_gbps, device)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}-gemm.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


def model_config(path: Path) -> dict[str, Any]:
    return dict(read_config(path).text)


# a record as an API's client might ask for it: strings, a bounded integer, an enum, a short list
RECORD = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24}, "city": {"type": "string", "maxLength": 16},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "status": {"enum": ["active", "idle", "gone"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4}},
    "required": ["name", "city", "age", "status", "tags"], "additionalProperties": False}


def records_grammar(tokenizer: str, vocab: int, eos: tuple[int, ...], new_tokens: int) -> Grammar:
    """A grammar of a list of RECORDs at least as long as ``new_tokens`` tokens can write (each record
    takes more than one), so no stream ends before its tokens, compiled against ``tokenizer`` (its
    JSON; ``eos``: the model's end tokens, which the list never reaches)."""
    schema = {"type": "array", "items": RECORD, "minItems": new_tokens}
    return Vocabulary(tokenizer, vocab, eos).compile(f"start: {json_rule(schema)}\n")

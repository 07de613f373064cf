"""``tfd bench``'s flags sorted between the engine bench and ``--serve``, and ``--serve``'s body.

``conflicts`` names a flag given where it means nothing (an engine-only flag with ``--serve``, a
``--serve`` flag without it), before anything loads; ``engine_defaults`` gives the engine bench its
usual values for the flags both share. ``main`` runs the HTTP runs (``tfd.bench.serve``) and, with
``--compare-engine``, the engine bench after them (``tfd.bench.versus``). No torch here: a plain
``--serve`` run never loads it (``--text`` and ``--compare-engine`` do).
"""

from __future__ import annotations

import argparse
import math
import sys

import trio

from tfd.bench.client import Target
from tfd.bench.serve import Unreachable, serve_runs
from tfd.bench.serve_record import Load, Spec, revision
from tfd.env import Settings

ENGINE_ONLY = {"streams": "--streams", "profile": "--profile", "compare_hf": "--compare-hf",
               "rounds": "--rounds", "random_weights": "--random-weights", "gemm": "--gemm",
               "variant": "--variant", "conversation": "--conversation",
               "tensor_parallel": "--tensor-parallel"}  # --serve's width: --concurrency
SERVE_ONLY = {"concurrency": "--concurrency", "rate": "--rate", "requests": "--requests",
              "no_warm": "--no-warm", "seed": "--seed", "api_key": "--api-key", "timeout": "--timeout",
              "no_drafts": "--no-drafts", "cache": "--cache", "compare_engine": "--compare-engine",
              "write_conversation": "--write-conversation", "resume_conversation": "--resume-conversation"}
CONVERSATION_NOT = {"rate": "--rate", "requests": "--requests", "cache": "--cache", "text": "--text",
                    "compare_engine": "--compare-engine", "temperature": "--temperature"}  # greedy, cache on
EXIT_REFUSED = 2


def conflicts(args: argparse.Namespace) -> str | None:
    """What is wrong with the combination of flags, or None."""
    if args.serve is None:
        given = [flag for name, flag in SERVE_ONLY.items() if getattr(args, name) not in (None, False)]
        if given:
            return f"{', '.join(given)}: only with --serve URL"
        for name in ("prompt", "new"):
            span = getattr(args, name)
            if span is not None and span[0] != span[1]:
                return f"--{name} {span[0]}:{span[1]}: a range only with --serve URL; the engine bench " \
                       "runs one length"
        return None
    given = [flag for name, flag in ENGINE_ONLY.items() if getattr(args, name) not in (None, False)]
    if given:
        return f"{', '.join(given)}: not with --serve (its runs are --concurrency C or --rate R)"
    if args.write_conversation is not None or args.resume_conversation is not None:
        return conversation_conflicts(args)
    if args.compare_engine and args.rate and not args.concurrency:
        return "--compare-engine compares --concurrency runs; give at least one"
    if args.no_drafts and args.drafts is not None:
        return "--no-drafts and --drafts: give one (--drafts 0 is --no-drafts)"
    return None


def conversation_conflicts(args: argparse.Namespace) -> str | None:
    """What is wrong with ``--write-conversation`` or ``--resume-conversation``'s flags, or None."""
    if args.write_conversation is not None and args.resume_conversation is not None:
        return "--write-conversation and --resume-conversation: one a call (the server restarts between them)"
    given = [flag for name, flag in CONVERSATION_NOT.items() if getattr(args, name) not in (None, False)]
    if args.write_conversation is not None and args.concurrency:
        given.append("--concurrency")
    if given:
        return f"{', '.join(given)}: not with a conversation (one greedy turn, the prompt cache in play)"
    if args.resume_conversation is not None and (lengths := [
            f"--{name}" for name in ("prompt", "new") if getattr(args, name) is not None]):
        return f"{', '.join(lengths)}: not with --resume-conversation (its file holds the conversation)"
    for name in ("prompt", "new"):
        span = getattr(args, name)
        if span is not None and span[0] != span[1]:
            return f"--{name} {span[0]}:{span[1]}: a conversation has one length"
    if args.resume_conversation is not None and (len(args.concurrency or ()) != 1 or args.concurrency[0] < 2):
        return "--resume-conversation needs one --concurrency C, C >= 2 (turn two beside C - 1 streams)"
    if args.drafts is not None and len(args.drafts) != 1:
        return "--drafts: one count with a conversation"
    return None


def engine_defaults(args: argparse.Namespace) -> None:
    """The engine bench's values of the flags it shares with ``--serve`` (left None by the parser)."""
    args.streams = args.streams or [1]
    args.prompt = (args.prompt or (1024, 1024))[0]
    args.new = (args.new or (256, 256))[0]
    args.drafts = [0] if args.drafts is None else args.drafts
    args.temperature = 1.0 if args.temperature is None else args.temperature


def specs(args: argparse.Namespace) -> list[Spec]:
    """The runs: each concurrency, then each rate, each at every drafting asked (``--no-drafts`` or
    ``--drafts 0``: ``"draft": false``; ``--drafts N``: ``true``; neither: the server's default)."""
    if args.no_drafts:
        drafting: list[tuple[bool | None, int]] = [(False, 0)]
    elif args.drafts is not None:
        drafting = [(most > 0, most) for most in args.drafts]
    else:
        drafting = [(None, 0)]
    found = [Spec(args.requests or max(4 * c, 8), concurrency=c, draft=draft, drafts=most)
             for c in args.concurrency or ([] if args.rate else [1]) for draft, most in drafting]
    found += [Spec(args.requests or max(16, math.ceil(10 * r)), rate=r, draft=draft, drafts=most)
              for r in args.rate or [] for draft, most in drafting]
    return found


def main(settings: Settings, args: argparse.Namespace) -> int:
    """``tfd bench --serve URL``: the exit status (1 when a request failed or the engine could not run)."""
    shape = settings.optional("TF_SHAPE", str)
    if args.compare_engine and shape is None:
        print("tfd bench: --compare-engine needs --shape NAME (TF_SHAPE), the shape the server serves: the "
              "engine bench draws its weights at random in this process", file=sys.stderr)
        return EXIT_REFUSED
    try:
        target = Target.parse(args.serve, args.api_key)
    except ValueError as error:
        print(f"tfd bench: {error}", file=sys.stderr)
        return EXIT_REFUSED
    load = Load(prompt=args.prompt or (1024, 1024), new=args.new or (256, 256),
                temperature=0.0 if args.temperature is None else args.temperature, cache=args.cache,
                text=args.text, seed=args.seed or 0, timeout=args.timeout or 600.0, warm=not args.no_warm)
    commit = args.commit or revision()
    if args.write_conversation is not None or args.resume_conversation is not None:
        return conversation(target, load, args, commit)
    try:
        runs = trio.run(serve_runs, target, load, specs(args), args.out, commit)
    except (Unreachable, ValueError) as error:
        print(f"tfd bench: {error}", file=sys.stderr)
        return 1
    status = 1 if any(run["error_count"] for run in runs) else 0
    if args.compare_engine:
        from tfd.bench.versus import compare

        status = max(status, compare(runs, shape, args, settings.value("TF_MTP_MAX_LANES", int), args.out,
                                     commit, fp8=settings.value("TF_DTYPE", str) == "fp8"))
    return status


def conversation(target: Target, load: Load, args: argparse.Namespace, commit: str) -> int:
    """``--write-conversation`` or ``--resume-conversation`` (``tfd.bench.serve_conversation``)."""
    from tfd.bench.serve_conversation import resume_conversation, write_conversation

    try:
        if args.write_conversation is not None:
            return write_conversation(target, load, args.write_conversation)
        draft = False if args.no_drafts else None if args.drafts is None else args.drafts[0] > 0
        return resume_conversation(target, load, args.concurrency[0], draft, args.resume_conversation,
                                   args.out, commit)
    except (Unreachable, ValueError) as error:
        print(f"tfd bench: {error}", file=sys.stderr)
        return 1

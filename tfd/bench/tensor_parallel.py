"""``tfd bench --tensor-parallel N``: the engine bench on N ranks, one process a device (rank r on the r-th
card; CPU processes over gloo where there is no GPU), as ``tfd serve --tensor-parallel N`` runs them.

Rank 0 checks the split (``tfd.server.ranks.refusals``: counts the size does not divide, FP8 shares
that would cut a scale block, too few cards), starts the other ranks (``python -m
tfd.bench.tensor_parallel``, the parsed flags on their standard input) and runs the bench itself.
Every rank draws or reads its own share of the model and runs the same workloads: the prompts are
drawn from the same seeds and the tokens from logits that are the same bits on every rank, so their
steps and collectives meet without a word between them.
Rank 0 alone prints and writes; each run adds its size, a step's sums over the ranks timed alone and
its roofline fraction without them (a rank's bytes over one card's copy rate).

Error handling: flags the ranks cannot run together (``conflicts``) are refused before anything starts;
a rank that fails logs it under its rank and exits 1, and rank 0's next collective fails. Resource
handling: rank 0 waits for the other ranks once its bench ends (``Ranks.close``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import torch
import torch.distributed as dist

from tfd.env import Settings
from tfd.exit_status import EXIT_FAILURE
from tfd.model.parallel import Parallel
from tfd.server.ranks import joined_rank, refusals, start

log = logging.getLogger("tfd.bench")
# what one rank's bench does alone, or measures apart from the ranks' steps
NOT_WITH = {"profile": "--profile", "compare_hf": "--compare-hf", "gemm": "--gemm", "variant": "--variant",
            "conversation": "--conversation"}
MODULE = "tfd.bench.tensor_parallel"


def conflicts(args: argparse.Namespace) -> str | None:
    """What ``--tensor-parallel`` above one cannot run with, by flag, or None."""
    size = getattr(args, "tensor_parallel", None) or 1
    given = [flag for name, flag in NOT_WITH.items() if getattr(args, name, None) not in (None, False)]
    if size > 1 and given:
        return f"--tensor-parallel {size}: not with {', '.join(given)} yet (give --tensor-parallel 1)"
    return None


def run_ranks(settings: Settings, args: argparse.Namespace) -> int:
    """Rank 0 of ``args.tensor_parallel``: the split checked, the other ranks started, the bench run."""
    from tfd.bench.command import run

    size = args.tensor_parallel
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # the serving row's refusals, said as this command's flag
    problems = [problem.replace(f"TF_TENSOR_PARALLEL={size}", f"--tensor-parallel {size}")
                for problem in refusals(settings, os.environ, device, size)]
    if settings.value("TF_EXPERT_PARALLEL", bool):
        problems.append("TF_EXPERT_PARALLEL=1: the bench splits experts by inner width only yet; unset it")
    if problems:
        for problem in problems:
            print(f"tfd bench: {problem}", file=sys.stderr)
        return EXIT_FAILURE
    ranks = start(settings, os.environ, size, device, module=MODULE, extra=args)
    try:
        return run(settings, args, Parallel(0, size, control=ranks.control))
    finally:
        ranks.close()


def main() -> int:
    """Another rank (``python -m tfd.bench.tensor_parallel``): join, run the same bench silently."""
    from tfd.bench.command import run

    joining, control = joined_rank()
    assert isinstance(joining.extra, argparse.Namespace)
    args = argparse.Namespace(**{**vars(joining.extra), "out": None})  # rank 0 writes the runs
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (rank 0 prints; this stays open until the process exits)
    try:
        return run(joining.settings, args, Parallel(joining.rank, joining.size, control=control))
    except Exception:
        log.exception("tensor parallel rank %d stopped", joining.rank)
        return 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())

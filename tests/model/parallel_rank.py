"""One rank of a tensor-parallel run on the CPU over gloo, for ``test_tensor_parallel``: the tiny
checkpoint loaded as this rank's share, a prompt's logits, and greedy and sampled lanes run alone, side
by side, drafted by the MTP head, and resumed from a kept state, through the engine's runner; rank 0
writes what it saw as JSON.

``python parallel_rank.py RANK SIZE RENDEZVOUS CHECKPOINT OUT [experts] [cuda]``: RENDEZVOUS is a file
every rank of the run names (torch.distributed's ``file://``); ``experts``: expert parallel; ``cuda``:
every rank on the one card in bf16, the kernels' path, the sums through the host (gloo); a refused
split is written as ``{"refused": ...}``. The test forks its ranks from a server that has imported this
module (``logged``), rather than paying a fresh interpreter's imports a rank.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: reference_loop

from reference_loop import LanePool

from tfd.bench.workload import drive
from tfd.checkpoint import Checkpoint, CheckpointError
from tfd.engine.local_runner import runner_for
from tfd.engine.request import Request, Sampling
from tfd.engine.runner import Drafting
from tfd.families.hybrid import HybridModel, load_model
from tfd.model.memory import Span
from tfd.model.parallel import Parallel

PROMPT = tuple(range(5, 45))
STEP_TOKENS = 64  # the long prompt is prefilled in two chunks


def requests() -> list[Request]:
    long = tuple((7 * i + 3) % 200 + 8 for i in range(90))
    return [Request("greedy", PROMPT, 10, Sampling(0.0)),
            Request("sampled", tuple(range(60, 80)), 10, Sampling(1.0, seed=4)),
            Request("long", long, 6, Sampling(0.0))]


def prompt_logits(model: HybridModel, device: str, dtype: torch.dtype, prompt: tuple[int, ...] = PROMPT
                  ) -> torch.Tensor:
    """``prompt``'s logits, a row a position, from one lane's prefill."""
    # a GDN state of heads of 128 (fp32 on both paths) needs 128 rows of fp32 activations a page, 256 of bf16
    lanes = LanePool(model, len(prompt), page_rows=128 if dtype == torch.float32 else 256)
    ids = torch.tensor(prompt, device=device)
    return model.logits(lanes.forward([Span(lanes.open(), 0, ids)]).hidden)


def first_rows(model: HybridModel, device: str, dtype: torch.dtype) -> list[torch.Tensor]:
    """The logits the greedy requests' first tokens are drawn from (their prompts' last rows), in order."""
    return [prompt_logits(model, device, dtype, request.prompt)[-1] for request in requests()
            if request.sampling.temperature == 0.0]


def main(rank: int, size: int, rendezvous: str, checkpoint: str, out: str, experts: bool, device: str
         ) -> None:
    parallel = None
    if size > 1:
        dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=size)
        parallel = Parallel(rank, size, experts=experts)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # on one card the ranks share (gloo)
    try:
        model = load_model(Checkpoint.open(Path(checkpoint)), device, dtype, progress=False,
                           parallel=parallel)
    except CheckpointError as error:
        if rank == 0:
            Path(out).write_text(json.dumps({"refused": str(error)}))
        if parallel is not None:  # every rank refuses: none leaves while another still connects
            dist.barrier()
            dist.destroy_process_group()
        return
    logits = prompt_logits(model, device, dtype)
    asked = requests()
    alone = [drive(model, [request], STEP_TOKENS, graphs=False).tokens[0] for request in asked]
    together = drive(model, asked, STEP_TOKENS, graphs=False).tokens
    drafted = drive(model, asked, STEP_TOKENS, graphs=False, drafting=Drafting(2, 0.0))
    kept = runner_for(model, asked[2].window, 1, graphs=False, kept_states=2)  # the long prompt, kept
    first = drive(model, [asked[2]], STEP_TOKENS, graphs=False, runner=kept)
    again = drive(model, [asked[2]], STEP_TOKENS, graphs=False, runner=kept)  # resumed from its state
    firsts = first_rows(model, device, dtype)  # every rank: the forward's sums take them all
    if rank == 0:
        Path(out).write_text(json.dumps({
            "logits": logits.float().tolist(), "alone": alone, "together": together,
            "firsts": [row.float().tolist() for row in firsts],
            "drafted": drafted.tokens,
            "verified": drafted.drafts.drafted, "resumed": [first.tokens[0], again.tokens[0]],
            "cached": [first.cached[0], again.cached[0]], "heads": model.cfg.heads,
            "value_heads": model.cfg.value_heads}))
    if parallel is not None:
        dist.destroy_process_group()


def logged(log: str, rank: int, size: int, rendezvous: str, checkpoint: str, out: str, experts: bool,
           device: str) -> None:
    """``main`` with this process's stdout and stderr (a traceback included) going to ``log``."""
    with open(log, "wb") as file:
        os.dup2(file.fileno(), 1)
        os.dup2(file.fileno(), 2)
    torch.set_num_threads(1)  # as OMP_NUM_THREADS=1 would: the ranks share the machine's cores
    main(rank, size, rendezvous, checkpoint, out, experts, device)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:6], experts="experts" in sys.argv[6:],
         device="cuda" if "cuda" in sys.argv[6:] else "cpu")

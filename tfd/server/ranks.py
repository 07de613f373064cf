"""The other ranks of a tensor-parallel daemon (TF_TENSOR_PARALLEL): started by rank 0, each a process
of its own (``python -m tfd.server.follower``) that loads its share of the model, builds its engine
and runs the steps rank 0 shares (``tfd.engine.lockstep``) until rank 0's engine stops.

Rank 0 (``start``) makes a rendezvous file in a fresh directory, starts each process with what it
needs on its standard input (the settings rank 0 read, the environment, the device, its rank, the
size, the rendezvous), then joins the process group itself. On the CPU the group is gloo; on CUDA
rank r runs on the r-th card rank 0 sees, the blocks' sums go over NCCL and a gloo group beside it
carries what the hosts agree on (``Parallel.control``). Each other rank's process sees its card alone
(``CUDA_VISIBLE_DEVICES``), as its ``cuda:0``: every thread of it, the readers and writers of learned
states included, then means that card by "cuda" without being told. Their logs go to rank 0's
standard error, each line naming its rank.

Signals: the other ranks ignore SIGTERM and SIGINT (``tfd.server.follower``); rank 0 drains, its
engine shares the stop, and they end after their last step.

Resource handling: ``Ranks.close`` waits for the processes to end (they end once rank 0's engine has
stopped and shared its stop), kills any still running after ``STOP_S``, leaves the group and removes
the rendezvous directory. Error handling: a process that cannot start or exits before the group
forms makes ``start`` raise ``RuntimeError`` naming its rank and status; a rank whose load fails
exits non-zero, and rank 0's next collective fails (the engine stops, the daemon drains and exits).
"""

from __future__ import annotations

import datetime
import logging
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import attrs
import torch
import torch.distributed as dist

from tfd.env import Settings
from tfd.model.parallel import Parallel

log = logging.getLogger("tfd.ranks")
JOIN_S = 600.0  # the group forming, and any one collective: a rank loading a large checkpoint meanwhile
WATCH_S = 0.2  # how often rank 0 looks whether a rank died while the group forms
STOP_S = 30.0  # the other ranks' end once rank 0's engine stopped: their last step and a group torn down


@attrs.frozen
class Joining:
    """What a rank process reads on its standard input."""

    settings: Settings
    environ: dict[str, str]
    device: str  # rank 0's TF_DEVICE, as picked: "cpu" or "cuda"
    rank: int
    size: int
    rendezvous: str
    extra: object = None  # what else the rank's module reads (``tfd bench``'s parsed arguments)


class Ranks:
    """Ranks 1 to size - 1, as processes rank 0 started; ``control``: ``join``'s."""

    def __init__(self, processes: list[subprocess.Popen[bytes]], folder: Path,
                 control: dist.ProcessGroup | None = None) -> None:
        self.processes = processes
        self.folder = folder
        self.control = control

    def close(self) -> None:
        """Wait for every rank to end (``STOP_S`` at most), kill those still running, and leave the group."""
        deadline = time.monotonic() + STOP_S
        for rank, process in enumerate(self.processes, 1):
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("rank %d still running %gs after the engine stopped: killed", rank, STOP_S)
                process.kill()
                process.wait()
        if dist.is_initialized():
            dist.destroy_process_group()
        shutil.rmtree(self.folder, ignore_errors=True)


def rank_of(settings: Settings, number: int, control: dist.ProcessGroup | None = None) -> Parallel:
    """Rank ``number`` of TF_TENSOR_PARALLEL's size, its experts placed as TF_EXPERT_PARALLEL says;
    ``control``: ``join``'s group for the hosts' agreements."""
    return Parallel(number, settings.value("TF_TENSOR_PARALLEL", int),
                    experts=settings.value("TF_EXPERT_PARALLEL", bool), control=control)


OWN_CARD = torch.device("cuda", 0)  # a rank's card on CUDA: the only one its process sees (``start``)


def device_of(device: torch.device, parallel: Parallel | None) -> torch.device:
    """The device a rank runs on: on CUDA its card (``OWN_CARD``), else ``device``."""
    return OWN_CARD if parallel is not None and device.type == "cuda" else device


def card_environ(rank: int) -> dict[str, str]:
    """The environment of rank ``rank``'s process on CUDA: this one's, seeing only the ``rank``-th card
    of those this process sees (CUDA_VISIBLE_DEVICES's list, else all of them)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    cards = [card.strip() for card in visible.split(",")] if visible else \
        [str(index) for index in range(torch.cuda.device_count())]
    return {**os.environ, "CUDA_VISIBLE_DEVICES": cards[rank]}


def refusals(settings: Settings, environ: Mapping[str, str], device: torch.device, size: int) -> list[str]:
    """What TF_TENSOR_PARALLEL=``size`` cannot serve, by name, before any rank starts: the served
    model's counts that do not split and FP8 weights whose shares would cut a scale block
    (``tfd.families.sharding``), expert parallel for a model without experts (or on CUDA: not yet),
    fewer CUDA cards than ranks, a card named (rank r takes card r)."""
    from tfd.checkpoint import Checkpoint, read_config
    from tfd.families.config import read_config as hybrid_config
    from tfd.families.hybrid import expected_tensors
    from tfd.families.sharding import block_refusals
    from tfd.families.sharding import refusals as split_refusals
    from tfd.models import model_directory
    from tfd.quantization import released_fp8, scales_of

    row = f"TF_TENSOR_PARALLEL={size}"
    problems = []
    if device.type == "cuda" and device.index is not None:
        problems.append(f"TF_DEVICE={device}: under {row} rank r runs on the r-th card; set TF_DEVICE=cuda "
                        "and choose the cards with CUDA_VISIBLE_DEVICES")
    if device.type == "cuda" and torch.cuda.device_count() < size:
        problems.append(f"{row}: a rank a card, and torch sees {torch.cuda.device_count()} CUDA devices "
                        f"here; TF_TENSOR_PARALLEL={torch.cuda.device_count()} is the most")
    path, shape = model_directory(settings, environ, device)
    config = read_config(path)
    cfg, experts = hybrid_config(config.family, config.text), settings.value("TF_EXPERT_PARALLEL", bool)
    if config.quantization is not None and shape is None:  # a checkpoint's FP8 weights: those with scales
        stored = Checkpoint.open(path).tensors
        _, _, shapes = expected_tensors(config.family, config.text, stored.keys())
        problems += block_refusals(cfg, shapes, size, experts, lambda name, _: scales_of(name) in stored)
    elif settings.value("TF_DTYPE", str) == "fp8":  # a shape's, drawn as the -FP8 releases hold them
        _, _, shapes = expected_tensors(config.family, config.text, set())
        problems += block_refusals(cfg, shapes, size, experts, released_fp8)
    if experts and not cfg.experts:
        problems.append(f"TF_EXPERT_PARALLEL=1: {config.family} has no routed experts to place on ranks")
    elif experts and device.type == "cuda":
        problems.append("TF_EXPERT_PARALLEL=1: experts placed whole run on the CPU's path only yet; on "
                        "CUDA leave it 0 (each rank holds a share of every expert)")
    problems += split_refusals(cfg, size, experts)
    return problems


def start(settings: Settings, environ: Mapping[str, str], size: int, device: torch.device,
          module: str = "tfd.server.follower", extra: object = None) -> Ranks:
    """Start ranks 1 to ``size`` - 1 (``python -m module``, ``extra`` in what each reads) and join the
    group with them as rank 0 (blocking: seconds, until every process has imported torch and joined)."""
    folder = Path(tempfile.mkdtemp(prefix="tfd-ranks-"))
    rendezvous = f"file://{folder / 'rendezvous'}"
    processes: list[subprocess.Popen[bytes]] = []
    joined: list[dist.ProcessGroup | None] = []
    try:
        for rank in range(1, size):
            process = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE,
                                       env=card_environ(rank) if device.type == "cuda" else None)
            processes.append(process)
            assert process.stdin is not None
            process.stdin.write(pickle.dumps(Joining(settings, dict(environ), device.type, rank, size,
                                                     rendezvous, extra)))
            process.stdin.close()
        joining = threading.Thread(target=lambda: joined.append(join(rendezvous, 0, size, device)),
                                   name="tfd-ranks-join", daemon=True)
        joining.start()
        while joining.is_alive():  # a rank that dies before it joins would leave rank 0 waiting JOIN_S
            joining.join(WATCH_S)
            _all_running(processes)
        if not joined:
            raise RuntimeError("the tensor parallel group did not form")
        _all_running(processes)  # one may have died as the group formed
    except BaseException:
        Ranks(processes, folder).close()
        raise
    log.info("tensor parallel: %d ranks joined", size)
    return Ranks(processes, folder, joined[0])


def joined_rank() -> tuple[Joining, dist.ProcessGroup | None]:
    """In a process ``start`` started: what rank 0 sent on its standard input, logging set up with each
    line naming the rank, the group joined; and ``join``'s control group."""
    joining = pickle.load(sys.stdin.buffer)
    assert isinstance(joining, Joining)
    logging.basicConfig(level=joining.settings.value("TF_LOG_LEVEL", str).upper(), stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s rank {joining.rank} %(name)s: %(message)s")
    return joining, join(joining.rendezvous, joining.rank, joining.size, torch.device(joining.device))


def _all_running(processes: list[subprocess.Popen[bytes]]) -> None:
    """``RuntimeError`` naming the first rank whose process has exited."""
    for rank, process in enumerate(processes, 1):
        if process.poll() is not None:
            raise RuntimeError(f"tensor parallel rank {rank} exited with status {process.returncode} "
                               "before the group formed (its log is above)")


def join(rendezvous: str, rank: int, size: int, device: torch.device) -> dist.ProcessGroup | None:
    """Join the process group as ``rank`` of ``size``: gloo on the CPU (None: the one group carries
    everything); on CUDA, the process's first card (its own: ``start``) made current and NCCL for the
    blocks' sums, with the gloo group for the hosts' agreements returned beside it."""
    timeout = datetime.timedelta(seconds=JOIN_S)
    if device.type != "cuda":
        dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=size, timeout=timeout)
        return None
    torch.cuda.set_device(OWN_CARD)
    dist.init_process_group("nccl", init_method=rendezvous, rank=rank, world_size=size, timeout=timeout,
                            device_id=OWN_CARD)  # NCCL's communicator made now, before any graph is captured
    control: dist.ProcessGroup = dist.new_group(backend="gloo", timeout=timeout)
    return control

"""``tfd bench --conversation``: a conversation's second turn after a restart, read from disk or cold.

Turn one (``prompt`` random tokens, ``new`` tokens drawn) runs through a runner whose prompt cache
writes its kept states to a store in a fresh directory; the writes are waited for and the files
dropped from the page cache (``posix_fadvise``), so turn two reads them from the disk. Turn two (turn
one, its reply, and 64 tokens more) then runs as after a restart: a new runner, an empty memory, the
same store; its time to first token includes reading the state back. Again on another new runner,
the files now in the page cache (a restart on the same machine); then the same turn two on a runner
without any cache: the cold prefill. A shorter conversation runs first, untimed, so every kernel is
compiled. One JSON object: the times, their ratios, the bytes written and read, the read bandwidths,
and the host's own: the store's files read from the page cache by as many threads, nothing copied
or checked (the ceiling of the page-cache case, which differs from host to host).
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import torch

from tfd.bench.defaults import STEP_TOKENS
from tfd.bench.workload import drive
from tfd.cache import learned as learned_states
from tfd.cache.learned import Learned
from tfd.engine.local_runner import runner_for
from tfd.engine.request import Request, Sampling
from tfd.engine.runner import Runner
from tfd.families.hybrid import HybridModel
from tfd.store.store import Store, StoreCounts

FOLLOW_UP = 64  # tokens the second turn adds after the first turn's reply
WARM_TOKENS = 4096  # the untimed conversation's prompt (a 1,024-token one left kernels to the timed turn)
IDENTITY = "bench"


def learning(model: HybridModel, window: int, graphs: bool, root: Path, keep_gain: int) -> Runner:
    """A one-lane runner whose prompt cache (room for a state; a resumed lane keeps again
    ``keep_gain`` tokens on) writes to a store under ``root``."""
    runner = runner_for(model, window, 1, graphs, kept_states=1, keep_gain=keep_gain)
    store = Store(root, IDENTITY, 1 << 50, 1 << 50, 0)
    assert runner.cache is not None
    runner.cache.attach(Learned(store, runner.pool, runner.pool.buffer.device, context=window))
    return runner


def closed(runner: Runner) -> StoreCounts:
    """Let the writer of a runner ``learning`` made finish, then stop it; what its store did."""
    assert runner.cache is not None and runner.cache.learned is not None
    runner.cache.learned.close()
    return runner.cache.learned.store.counts


def drop_page_cache(root: Path) -> None:
    """Ask the kernel to forget the store's file pages, so the next read comes from the disk."""
    for base, _, files in os.walk(root):
        for name in files:
            handle = os.open(os.path.join(base, name), os.O_RDONLY)
            try:
                os.fsync(handle)
                os.posix_fadvise(handle, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(handle)


def conversation(model: HybridModel, prompt_tokens: int, new_tokens: int, graphs: bool,
                 step_tokens: int = STEP_TOKENS, seed: int = 0, keep_gain: int = 0) -> dict[str, Any]:
    """Turn two's time to first token read back from disk after a restart, and cold; a shorter
    conversation first, untimed (4,096 tokens), so kernels compile before either is timed.
    ``keep_gain``: as TF_PROMPT_KEEP_GAIN."""
    # past two attention spans, so the short chunk's split attention and its merge compile here too
    turns(model, min(prompt_tokens, WARM_TOKENS), new_tokens, graphs, step_tokens, seed + 1, keep_gain)
    return turns(model, prompt_tokens, new_tokens, graphs, step_tokens, seed, keep_gain)


@attrs.frozen
class FirstTurn:
    """A conversation's first turn run and its kept states written to a store (``first_turn``): the
    second turn that follows it, the rows a lane of either holds at most, what the writer did and how
    long closing it waited for the writes."""

    second: Request
    window: int
    written: StoreCounts
    waited_s: float


def first_turn(model: HybridModel, prompt_tokens: int, new_tokens: int, graphs: bool, step_tokens: int,
               seed: int, root: Path, keep_gain: int) -> FirstTurn:
    """Turn one (``prompt_tokens`` random tokens, ``new_tokens`` drawn greedily) through a runner
    whose kept states are written to a store under ``root``, the writes waited for; turn two: turn
    one, its reply and ``FOLLOW_UP`` tokens more."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.cfg.vocab, (prompt_tokens,), generator=generator)
    first = Request("turn-1", tuple(ids.tolist()), new_tokens, Sampling(temperature=0.0))
    window = prompt_tokens + 2 * new_tokens + FOLLOW_UP
    writer = learning(model, window, graphs, root, keep_gain)
    reply = drive(model, [first], step_tokens, graphs, runner=writer).tokens[0]
    began = time.perf_counter()
    written = closed(writer)
    waited_s = time.perf_counter() - began
    follow = tuple(torch.randint(0, model.cfg.vocab, (FOLLOW_UP,), generator=generator).tolist())
    second = Request("turn-2", first.prompt + reply + follow, new_tokens, Sampling(temperature=0.0))
    return FirstTurn(second, window, written, waited_s)


def turns(model: HybridModel, prompt_tokens: int, new_tokens: int, graphs: bool, step_tokens: int,
          seed: int, keep_gain: int) -> dict[str, Any]:
    """One conversation: turn two read back with the page cache dropped, then again with it kept
    (a restart on the same machine), then cold."""
    root = Path(tempfile.mkdtemp(prefix="tfd-bench-learned-"))
    try:
        turn = first_turn(model, prompt_tokens, new_tokens, graphs, step_tokens, seed, root, keep_gain)
        second, window, written, waited_s = turn.second, turn.window, turn.written, turn.waited_s
        drop_page_cache(root)
        reader = learning(model, window, graphs, root, keep_gain)
        restored = drive(model, [second], step_tokens, graphs, runner=reader)
        read = closed(reader)
        del reader
        # the files are in the page cache now
        cached_reader = learning(model, window, graphs, root, keep_gain)
        again = drive(model, [second], step_tokens, graphs, runner=cached_reader)
        cached_read = closed(cached_reader)
        del cached_reader
        host_bytes, host_s = host_read(root)
        cold = drive(model, [second], step_tokens, graphs)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if not restored.tokens == again.tokens == cold.tokens:
        raise AssertionError("turn two read back from disk drew other tokens than the cold prefill")
    ttft, cold_ttft = restored.first_token_s[0], cold.first_token_s[0]
    return {"prompt_tokens": prompt_tokens, "turn2_prompt_tokens": len(second.prompt),
            "cached_tokens": restored.cached[0], "keep_gain": keep_gain, "ttft_from_disk_s": ttft,
            "ttft_cold_s": cold_ttft,
            "ratio": ttft / cold_ttft, "ttft_page_cache_s": again.first_token_s[0],
            "page_cache_ratio": again.first_token_s[0] / cold_ttft,
            "bytes_written": written.bytes_written, "write_wait_s": waited_s,
            "bytes_read": read.bytes_read, "read_s": read.read_s,
            "read_gbps": _gbps(read.bytes_read, read.read_s), "page_cache_read_s": cached_read.read_s,
            "page_cache_read_gbps": _gbps(cached_read.bytes_read, cached_read.read_s),
            "host_read_bytes": host_bytes, "host_read_s": host_s, "host_read_gbps": _gbps(host_bytes, host_s),
            "tokens_equal": True}


def host_read(root: Path, tries: int = 3) -> tuple[int, float]:
    """Bytes of every file under ``root`` and the best time of ``tries`` to read them all from the
    page cache, by as many threads as a state is read back with, into one buffer: the host's part."""
    files = sorted(Path(base) / name for base, _, names in os.walk(root) for name in names)
    sizes = [path.stat().st_size for path in files]
    buffer = bytearray(sum(sizes))
    starts = itertools.accumulate(sizes, initial=0)
    places = [(path, memoryview(buffer)[at:at + size])
              for path, size, at in zip(files, sizes, starts, strict=False)]

    def read(place: tuple[Path, memoryview]) -> None:
        with open(place[0], "rb", buffering=0) as handle:
            handle.readinto(place[1])

    best = float("inf")
    with ThreadPoolExecutor(learned_states.READ_THREADS) as threads:
        for _ in range(tries):
            began = time.perf_counter()
            list(threads.map(read, places))
            best = min(best, time.perf_counter() - began)
    return len(buffer), best


def _gbps(moved: int, seconds: float) -> float | None:
    return moved / seconds / 1e9 if seconds else None

"""The served model: loaded weights, the pool cut for them, and the engine running on both.

``prepare`` is blocking work for a worker thread at startup (weights; on a GPU the device's plan,
``tfd.pool.device_plan``; the pool); ``Service.start`` runs on the trio thread (it starts the engine
thread); ``warm_up`` sends the warm-up's requests through the engine (``tfd.server.warm_up``) and
checks that the pool's census is back at load before the daemon says READY. Out of device memory
at any of these is a configuration refusal naming the rows to change.
"""

from __future__ import annotations

import logging
import math
import os
import resource
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import torch
import trio

from tfd.engine.cache_face import ATTACH
from tfd.engine.config import EngineConfig, EngineRows, Hooks
from tfd.engine.engine import Engine
from tfd.engine.grammar import Vocabulary
from tfd.engine.lockstep import Leader, least
from tfd.engine.request import Finished, Request, Sampling
from tfd.engine.rounds import drafts_from_head
from tfd.env import Settings, SettingsRefused
from tfd.model import GDN_CHUNK as CHUNK
from tfd.model.parallel import Parallel
from tfd.models import Loaded, load
from tfd.pool.config import CPU_POOL_BYTES, GIB, PoolConfig
from tfd.pool.device_plan import DeviceTooSmall
from tfd.pool.errors import PoolShort
from tfd.pool.pages import AUTO_LANES_MOST, Pool
from tfd.pool.pieces import PieceOverPage
from tfd.pool.report import LoadReport
from tfd.server.device_memory import (
    auto_step_tokens,
    check_host_pool,
    device_bytes,
    free_at_load,
    host_available,
    plan_device,
)
from tfd.server.ranks import Ranks, device_of, rank_of, refusals
from tfd.server.ranks import start as start_ranks
from tfd.server.start_refusals import (
    OUT_OF_MEMORY,
    context_refusals,
    pool_source,
    refusing_oom,
)
from tfd.server.systemd import Heartbeat
from tfd.server.warm_up import by_kernel, short, warm_up, waves
from tfd.store.config import StoreConfig
from tfd.store.identity import PROBE_TOKENS, beside, facts, identity, part_digests, probe_prompt
from tfd.store.store import Store
from tfd_kernels.runtime import compiled_variants, watch_compiles

log = logging.getLogger("tfd.service")
# A step longer than this means the engine is stuck: the watchdog stops pinging.
ENGINE_STALL_S = 120.0
PROBE_AT = (PROBE_TOKENS - 1) // CHUNK * CHUNK  # where the identity probe's state is kept


@attrs.frozen
class Prepared:
    loaded: Loaded
    pool: Pool
    name: str
    report: LoadReport
    engine: EngineConfig
    parallel: Parallel | None = None  # tensor parallel: this process's rank
    ranks: Ranks | None = None  # rank 0's: the other ranks' processes


def pick_device(name: str) -> torch.device:
    """TF_DEVICE as a device; ``cuda`` without a usable GPU is refused by name."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SettingsRefused(["TF_DEVICE=cuda: torch sees no CUDA device here"])
    return torch.device(name)


def prepare(settings: Settings, environ: Mapping[str, str], parallel: Parallel | None = None) -> Prepared:
    """Load the model and cut the pool (blocking). Raises ``SettingsRefused`` for a TF_PARALLEL or
    TF_CONTEXT the pool cannot hold, naming what fits, and for a device too small for the weights
    and what serving needs beside them (out of memory at load included), naming the rows to change.
    With TF_TENSOR_PARALLEL above 1, rank 0 (``parallel`` None) starts the other ranks first
    (``tfd.server.ranks``), and each rank loads its share; ``parallel``: another rank's."""
    watch_compiles()  # from the first launch on: the load's, the warm-up's, then any while serving
    device = pick_device(settings.value("TF_DEVICE", str))
    size, ranks = settings.value("TF_TENSOR_PARALLEL", int), None
    if size > 1 and parallel is None:
        problems = refusals(settings, environ, device, size)
        if problems:
            raise SettingsRefused(problems)
        ranks = start_ranks(settings, environ, size, device)
        parallel = rank_of(settings, 0, ranks.control)
    try:
        return _prepared(settings, environ, device_of(device, parallel), parallel, ranks)
    except BaseException:
        if ranks is not None:
            ranks.close()
        raise


def _prepared(settings: Settings, environ: Mapping[str, str], device: torch.device, split: Parallel | None,
              ranks: Ranks | None) -> Prepared:
    with refusing_oom("loading the weights"):
        free = free_at_load(device)
        loaded = load(settings, environ, device, parallel=split)
    settings = loaded.settings
    config = PoolConfig.from_settings(settings, loaded.family)
    rows = EngineRows.from_settings(settings)
    drafting = rows.drafting(drafts_from_head(loaded.model))
    window = 1 + drafting.most if drafting is not None else 0  # rows a verify window takes at most
    layout = loaded.model.layout(config.page_rows, drafting is not None, window)
    try:  # a piece wider than a page is the settings' fault: refused before anything is allocated
        _ = layout.piece_map
    except PieceOverPage as error:
        raise SettingsRefused([config.over_page(error, settings)]) from None
    context, parallel = rows.context, rows.parallel
    step_tokens = rows.step_tokens or auto_step_tokens(device_bytes(device), config.memory_limit)
    plan = None
    if free is None:  # the CPU: the pool is TF_POOL_GIB, or its default there
        pool_bytes = config.size if config.size is not None else CPU_POOL_BYTES
        check_host_pool(pool_bytes, pool_source(config, None), host_available())
    else:
        with refusing_oom("measuring a step"):
            plan = plan_device(loaded.model, layout, device, free=free, limit=config.memory_limit,
                               weights=torch.cuda.memory_allocated(device), step_tokens=step_tokens,
                               lanes=parallel or AUTO_LANES_MOST, window=window,
                               graphs=rows.graphs and loaded.model.batches_decode)
        try:
            pool_bytes = plan.check(config.size)
        except DeviceTooSmall as small:
            raise SettingsRefused(small.problems) from None
    if split is not None:  # pieces and pages the same plan on every rank: the least pool any card leaves
        pool_bytes = least([pool_bytes], split.control)[0]
    gib = pool_bytes / GIB
    problems = context_refusals(settings, layout, pool_bytes, pool_source(config, plan), loaded.path)
    if problems:
        raise SettingsRefused(problems)
    fits = layout.plan(context, pool_bytes)
    try:
        with refusing_oom(f"allocating the pool of {gib:.2f} GiB"):
            pool = Pool.for_limit(layout, pool_bytes, context, parallel=parallel, mode=config.mode,
                                  device=device)
    except PoolShort:
        raise SettingsRefused([f"TF_PARALLEL={parallel}: {fits} lanes of {context} tokens fit the pool's "
                               f"{gib:.3g} GiB ({pool_source(config, plan)}); TF_PARALLEL={fits} is the "
                               "most"]) from None
    assert pool.max_lanes is not None
    name = settings.optional("TF_MODEL_NAME", str) or served_name(settings, loaded)
    report = LoadReport.of(pool, context, plan)
    log.info("%s", report.line())
    engine = rows.config(step_tokens, pool.max_lanes, drafting, pool.pages * layout.page_bytes)
    return Prepared(loaded, pool, name, report, engine, split, ranks)


def served_name(settings: Settings, loaded: Loaded) -> str:
    """The model's name in the API when TF_MODEL_NAME is unset: the checkpoint directory's, the
    shape's (saying its weights are random) or the demo's."""
    if loaded.shape is not None:
        return f"{loaded.shape.name}-random"
    if settings.optional("TF_MODEL", str) is None:
        return f"tfd-demo-{settings.value('TF_DEMO', str)}"
    return loaded.path.name


def resident_bytes() -> int:
    """This process's resident set (Linux's /proc; elsewhere its peak)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return pages * os.sysconf("SC_PAGE_SIZE")


def store_opener(prepared: Prepared, environ: Mapping[str, str], drafts: bool
                 ) -> Callable[[str], Store] | None:
    """With TF_LEARN_CONVERSATIONS, what opens the store of a probe digest's identity (the facts it
    covers: the checkpoint, the code, the device, the dtype, drafting, and a rank of its size under
    tensor parallel: each rank keeps its own share of every state); None without."""
    loaded = prepared.loaded
    learning = StoreConfig.from_settings(loaded.settings, environ)
    if not learning.enabled:
        return None
    found = facts(loaded.path, prepared.pool.buffer.device, loaded.model.dtype, drafts)
    if prepared.parallel is not None:
        found["tensor_parallel"] = [prepared.parallel.rank, prepared.parallel.size]

    def open_store(digest: str) -> Store:
        log.info("identity %s: the probe's state %s; %s", identity(found, digest), digest[:16],
                 ", ".join(f"{name} {part}" for name, part in part_digests(found).items()))
        store = learning.open(identity(found, digest))
        others = beside(store.home, found)
        if others:  # the same facts, another probe state: a start computed the probe in other bits
            log.warning("%d learned-conversation directories beside %s were written under the same "
                        "checkpoint, code, device and settings with another probe state (%s): their "
                        "conversations are not read by this start", len(others), store.home.name,
                        ", ".join(other.name for other in others))
        return store

    return open_store


def attach_mirror(prepared: Prepared, environ: Mapping[str, str], drafts: bool
                  ) -> dict[str, Callable[[Engine], object]]:
    """Another rank's mirror of rank 0's ``attach_store`` (``Engine``'s ``mirrors``): its own store."""
    opener = store_opener(prepared, environ, drafts)
    if opener is None:
        return {}
    prompt = probe_prompt(prepared.loaded.model.cfg.vocab)
    return {ATTACH: lambda engine: engine.cache.attach_now(prompt, PROBE_AT, opener)}


class Service:
    """What the HTTP routes serve: the model's name, tokenizer, template, engine and pool, and the
    vocabulary grammars are compiled against."""

    def __init__(self, prepared: Prepared, heartbeat: Heartbeat | None = None,
                 on_failure: Callable[[BaseException], None] | None = None,
                 on_step: Callable[[float, int], None] | None = None) -> None:
        self.prepared = prepared
        self.name = prepared.name
        self.loaded = prepared.loaded
        self.pool = prepared.pool
        self.report = prepared.report
        began = time.monotonic()
        loaded = prepared.loaded
        self.vocabulary = Vocabulary(loaded.tokenizer.to_str(), loaded.model.cfg.vocab, loaded.eos_ids)
        log.info("the grammars' vocabulary read in %.2fs", time.monotonic() - began)
        device = prepared.pool.buffer.device
        before = torch.cuda.memory_reserved(device) if device.type == "cuda" else 0
        with refusing_oom("capturing the decode graphs"):
            hooks = Hooks(None if heartbeat is None else heartbeat.beat, on_failure, on_step)
            leader = None if prepared.parallel is None else Leader(prepared.parallel.control)
            self.engine = Engine(prepared.loaded.model, prepared.loaded.tokenizer, prepared.pool,
                                 prepared.engine, hooks, leader)
        if device.type == "cuda":  # the graphs' private pools and the buffers the engine holds
            built = torch.cuda.memory_reserved(device) - before
            self.report = self.report.measured(engine_bytes_measured=built)
            log.info("the engine took %.2f GiB of the device (graphs estimated at %.2f GiB)", built / GIB,
                     (self.report.device or {}).get("graph_bytes", 0) / GIB)

    def start(self) -> None:
        self.engine.start()

    async def warm_up(self) -> None:
        """The warm-up (``tfd.server.warm_up``): full or short as TF_WARM_UP says (auto: full on a
        GPU, where kernels compile), then the census must be back at load. Raises ``SettingsRefused``
        when the device runs out of memory meanwhile, ``RuntimeError`` for another failure."""
        began = time.monotonic()
        settings, model = self.loaded.settings, self.loaded.model
        mode = settings.value("TF_WARM_UP", str)
        full = mode == "full" or (mode == "auto" and self.pool.buffer.device.type == "cuda")
        drafting = self.prepared.engine.drafting is not None
        pooled = model.cfg.indexer.block if model.cfg.indexer is not None else 1
        cache = self.engine.cache.enabled
        json_object = self.vocabulary.compile('start: %json {"type": "object"}')
        plan = waves(self.engine.limits, model.cfg.vocab, drafting, cache, pooled, json_object) if full \
            else short(model.cfg.vocab)
        before = len(compiled_variants())  # counted since prepare() began watching
        try:
            sent = await warm_up(self.engine, plan)
        except RuntimeError:
            if isinstance(self.engine.last_step_error, torch.OutOfMemoryError):
                raise SettingsRefused([OUT_OF_MEMORY.format(doing="warming up")]) from None
            raise
        await self.engine.cache.clear()  # the warm-up's prompts are nobody's conversation
        await self.engine.ask(self.pool.check_at_load)
        counted = f"{len(compiled_variants()) - before} kernel variants compiled" if watch_compiles() \
            else "kernel compiles not counted here"
        log.info("warm-up (%s): %d requests in %.2fs; %s", "full" if full else "short", sent,
                 time.monotonic() - began, counted)
        if watch_compiles():
            log.info("warm-up variants by kernel: %s", by_kernel(compiled_variants()[before:]))
        device = self.pool.buffer.device
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            self.report = self.report.measured(free_after_warm_up_bytes=free)
            log.info("device: %.2f GiB free after the warm-up", free / GIB)

    def check_learning_cache(self) -> None:
        """With TF_LEARN_CONVERSATIONS, a prompt cache that can keep the identity probe's state:
        refused by name before the warm-up (minutes on a fresh GPU), not after it."""
        settings, room = self.loaded.settings, self.engine.cache.room(PROBE_AT)
        if not settings.value("TF_LEARN_CONVERSATIONS", bool) or room is None:
            return
        need, budget = room
        if need > budget:
            raise SettingsRefused([
                f"TF_PROMPT_CACHE_GIB={settings.optional('TF_PROMPT_CACHE_GIB', float):g}: the identity "
                f"probe's kept state needs {need / GIB:.3g} GiB; TF_LEARN_CONVERSATIONS=1 needs "
                f"TF_PROMPT_CACHE_GIB={math.ceil(need / GIB * 1e4) / 1e4:g} or more"])

    async def learn(self, environ: Mapping[str, str]) -> str | None:
        """With TF_LEARN_CONVERSATIONS, the identity (a probe prompt's kept state's digest with the
        facts it covers) and the store of its learned states, attached to the engine; its name."""
        opener = store_opener(self.prepared, environ, self.engine.drafts)
        if opener is None or not self.engine.cache.enabled:
            return None
        prompt = probe_prompt(self.loaded.model.cfg.vocab)
        handle = self.engine.submit(Request("identity-probe", prompt, 1, Sampling(temperature=0.0),
                                            arrived=time.monotonic()), internal=True)
        async for event in handle.events:
            if isinstance(event, Finished) and event.reason in ("failed", "cancelled"):
                raise RuntimeError(f"the identity probe {event.reason}: {event.message}")
        store = await self.engine.cache.attach_store(prompt, PROBE_AT, opener)
        log.info("learned conversations in %s (%d states)", store.home, len(store.index.entries))
        return store.identity

    def memory(self) -> dict[str, int]:
        """The process's resident bytes; on a GPU, the device bytes torch holds, allocated (tensors)
        and reserved (its cache, the pool and the weights within)."""
        found = {"rss_bytes": resident_bytes()}
        device = self.pool.buffer.device
        if device.type == "cuda":
            found["device_allocated_bytes"] = torch.cuda.memory_allocated(device)
            found["device_reserved_bytes"] = torch.cuda.memory_reserved(device)
        return found

    async def census(self) -> dict[str, object]:
        return await self.engine.ask(lambda: self.pool.census().as_dict())  # type: ignore[no-any-return]

    async def kept(self) -> dict[str, object]:
        """What the prompt cache holds and did (admin ``learn``); ``{"enabled": false}`` without one."""
        return await self.engine.cache.report()

    async def evict(self) -> dict[str, int]:
        """Evict every kept prompt state, in memory and on disk; how many there were of each."""
        return await self.engine.cache.evict()

    async def lanes(self) -> list[dict[str, object]]:
        return await self.engine.lanes()

    async def close(self) -> None:
        """Stop the engine, then let the learned states offered be written; the other ranks end then."""
        await self.engine.close()
        if self.prepared.ranks is not None:
            await trio.to_thread.run_sync(self.prepared.ranks.close)

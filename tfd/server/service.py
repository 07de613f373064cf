"""The served model: loaded weights, the pool cut for them, and the engine running on both.

``prepare`` is blocking work for a worker thread at startup (weights, pool); ``Service.start``
runs on the trio thread (it starts the engine thread); ``warm_up`` sends one short request through
the engine and checks that the pool's census is back at load before the daemon says READY.
"""

from __future__ import annotations

import logging
import os
import resource
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import torch
import trio

from tfd.engine.engine import Engine, Limits
from tfd.engine.prefixes import key_at, prefix_digests
from tfd.engine.request import Finished, Request, Sampling
from tfd.engine.rounds import drafts_from_head
from tfd.engine.runner import Drafting
from tfd.env import Settings, SettingsRefused
from tfd.families.hybrid import HybridModel
from tfd.model import GDN_CHUNK as CHUNK
from tfd.models import Loaded, load
from tfd.pool.config import GIB, PoolConfig
from tfd.pool.errors import PoolShort
from tfd.pool.pages import Pool
from tfd.pool.report import LoadReport
from tfd.server.systemd import Heartbeat
from tfd.store.identity import PROBE_TOKENS, facts, identity, probe_prompt
from tfd.store.learned import Learned, state_digest
from tfd.store.store import Store

log = logging.getLogger("tfd.service")
# A step longer than this means the engine is stuck: the watchdog stops pinging.
ENGINE_STALL_S = 120.0
PROBE_AT = (PROBE_TOKENS - 1) // CHUNK * CHUNK  # where the identity probe's state is kept


@attrs.frozen
class Prepared:
    loaded: Loaded
    pool: Pool
    limits: Limits
    name: str
    report: LoadReport
    drafting: Drafting | None = None  # lanes draft from the MTP head
    kept_bytes: int = 0  # the prompt cache's budget (0: none)
    keep_gain: int = 0  # tokens a resumed lane prefills before it keeps again


def pick_device(name: str) -> torch.device:
    """TF_DEVICE as a device; ``cuda`` without a usable GPU is refused by name."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SettingsRefused(["TF_DEVICE=cuda: torch sees no CUDA device here"])
    return torch.device(name)


def prepare(settings: Settings, environ: Mapping[str, str]) -> Prepared:
    """Load the model and cut the pool (blocking). Raises ``SettingsRefused`` for a TF_PARALLEL or
    TF_CONTEXT the pool cannot hold, naming what fits."""
    check_learning(settings)
    device = pick_device(settings.value("TF_DEVICE", str))
    loaded = load(settings, environ, device)
    settings = loaded.settings
    config = PoolConfig.from_settings(settings, loaded.family)
    drafting = drafting_of(settings, loaded.model)
    window = 1 + drafting.most if drafting is not None else 0  # rows a verify window takes at most
    layout = loaded.model.layout(config.page_rows, drafting is not None, window)
    context = settings.value("TF_CONTEXT", int)
    gib = settings.value("TF_POOL_GIB", float)
    parallel = settings.optional("TF_PARALLEL", int)
    fits = layout.plan(context, int(gib * GIB))
    if fits == 0:
        need = layout.lane_bytes(context) + layout.page_bytes
        raise SettingsRefused([f"TF_CONTEXT={context}: one lane of {context} tokens needs "
                               f"{need / GIB:.3g} GiB; TF_POOL_GIB={gib:g} holds none"])
    try:
        pool = Pool.for_limit(layout, int(gib * GIB), context, parallel=parallel, mode=config.mode,
                              device=device)
    except PoolShort:
        raise SettingsRefused([f"TF_PARALLEL={parallel}: {fits} lanes of {context} tokens fit "
                               f"TF_POOL_GIB={gib:g}"]) from None
    assert pool.max_lanes is not None
    limits = Limits(context=context, step_tokens=settings.value("TF_STEP_TOKENS", int),
                    max_lanes=pool.max_lanes, queue=settings.value("TF_QUEUE_LIMIT", int))
    name = settings.optional("TF_MODEL_NAME", str) or (
        f"tfd-demo-{settings.value('TF_DEMO', str)}" if settings.optional("TF_MODEL", str) is None
        else loaded.path.name)
    report = LoadReport.of(pool, context)
    log.info("%s", report.line())
    kept_bytes = int(settings.value("TF_PROMPT_CACHE_GIB", float) * GIB)
    return Prepared(loaded, pool, limits, name, report, drafting, kept_bytes,
                    settings.value("TF_PROMPT_KEEP_GAIN", int))


def resident_bytes() -> int:
    """This process's resident set (Linux's /proc; elsewhere its peak)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return pages * os.sysconf("SC_PAGE_SIZE")


def learn_directory(settings: Settings, environ: Mapping[str, str]) -> Path:
    """TF_LEARN_DIR, else systemd's StateDirectory=, else the XDG state home."""
    explicit = settings.optional("TF_LEARN_DIR", str)
    if explicit:
        return Path(explicit)
    if environ.get("STATE_DIRECTORY"):
        return Path(environ["STATE_DIRECTORY"].split(":")[0]) / "learned"
    if environ.get("XDG_STATE_HOME"):
        return Path(environ["XDG_STATE_HOME"]) / "tfd" / "learned"
    return Path.home() / ".local" / "state" / "tfd" / "learned"


def check_learning(settings: Settings) -> None:
    """TF_LEARN_CONVERSATIONS needs a prompt cache: refused by name before anything loads."""
    if settings.value("TF_LEARN_CONVERSATIONS", bool) and settings.value("TF_PROMPT_CACHE_GIB", float) == 0:
        raise SettingsRefused(["TF_LEARN_CONVERSATIONS=1 requires TF_PROMPT_CACHE_GIB above 0: "
                               "learned states are the prompt cache's, written to disk"])


def drafting_of(settings: Settings, model: HybridModel) -> Drafting | None:
    """TF_DRAFTS and the MTP settings, for a model that drafts (``rounds.drafts_from_head``)."""
    if not settings.value("TF_DRAFTS", bool) or not drafts_from_head(model):
        return None
    return Drafting(settings.value("TF_MTP_DRAFTS", int), settings.value("TF_MTP_CONFIDENCE", float),
                    settings.value("TF_MTP_MAX_LANES", int))


class Service:
    """What the HTTP routes serve: the model's name, tokenizer, template, engine and pool."""

    def __init__(self, prepared: Prepared, heartbeat: Heartbeat | None = None,
                 on_failure: Callable[[BaseException], None] | None = None,
                 on_step: Callable[[float, int], None] | None = None) -> None:
        self.prepared = prepared
        self.name = prepared.name
        self.loaded = prepared.loaded
        self.pool = prepared.pool
        self.report = prepared.report
        graphs = prepared.loaded.settings.value("TF_CUDA_GRAPHS", bool)
        self.engine = Engine(prepared.loaded.model, prepared.loaded.tokenizer, prepared.pool, prepared.limits,
                             heartbeat, on_failure, on_step, graphs, prepared.drafting, prepared.kept_bytes,
                             prepared.keep_gain)

    def start(self) -> None:
        self.engine.start()

    async def warm_up(self) -> None:
        """One short greedy request through the engine; the census must come back to load."""
        began = time.monotonic()
        handle = self.engine.submit(Request("warm-up", (0, 1, 2, 3), 2, Sampling(temperature=0.0),
                                            arrived=began))
        async for event in handle.events:
            if isinstance(event, Finished) and event.reason in ("failed", "cancelled"):
                raise RuntimeError(f"the warm-up request {event.reason}: {event.message}")
        await self.engine.ask(self.pool.check_at_load)
        log.info("warm-up step done in %.2fs", time.monotonic() - began)

    async def learn(self, environ: Mapping[str, str]) -> str | None:
        """With TF_LEARN_CONVERSATIONS, the identity (a probe prompt's kept state's digest with the
        facts it covers) and the store of its learned states, attached to the engine; its name."""
        settings = self.loaded.settings
        runner = self.engine.runner
        if not settings.value("TF_LEARN_CONVERSATIONS", bool) or runner.kept is None:
            return None
        prompt = probe_prompt(self.loaded.model.cfg.vocab)
        handle = self.engine.submit(Request("identity-probe", prompt, 1, Sampling(temperature=0.0),
                                            arrived=time.monotonic()))
        async for event in handle.events:
            if isinstance(event, Finished) and event.reason in ("failed", "cancelled"):
                raise RuntimeError(f"the identity probe {event.reason}: {event.message}")
        found = facts(self.loaded.path, self.pool.buffer.device, self.loaded.model.dtype,
                      runner.rounds is not None)
        store_root = learn_directory(settings, environ)

        def attach() -> str:
            kept = runner.kept
            assert kept is not None
            state = kept.states.get(key_at(prompt, prefix_digests(prompt, PROBE_AT), PROBE_AT))
            if state is None:
                raise RuntimeError("the identity probe kept no state: TF_PROMPT_CACHE_GIB holds none")
            name = identity(found, state_digest(self.pool, state))
            kept.evict(state)
            store = Store(store_root, name, int(settings.value("TF_LEARN_GIB", float) * GIB),
                          int(settings.value("TF_LEARN_DAILY_GIB", float) * GIB),
                          int(settings.value("TF_LEARN_MIN_FREE_GIB", float) * GIB),
                          settings.value("TF_IMPRINT_VERIFY", bool))
            runner.learned = Learned(store, self.pool, self.pool.buffer.device,
                                     context=self.engine.limits.context)
            return name

        name: str = await self.engine.ask(attach)
        log.info("learned conversations in %s (%d states)", store_root / name,
                 len(runner.learned.store.index.entries) if runner.learned is not None else 0)
        return name

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
        """What the prompt cache holds and did (admin ``learn``); ``{"enabled": false}`` without one.
        The disk's part is read off the engine thread: it may wait for a write to end."""
        kept, learned = self.engine.runner.kept, self.engine.runner.learned
        if kept is None:
            return {"enabled": False}
        found: dict[str, object] = {"enabled": True, "memory": await self.engine.ask(kept.report)}
        if learned is not None:
            found["disk"] = await trio.to_thread.run_sync(learned.report)
        return found

    async def evict(self) -> dict[str, int]:
        """Evict every kept prompt state, in memory and on disk; how many there were of each."""
        kept, learned = self.engine.runner.kept, self.engine.runner.learned
        if kept is None:
            return {"evicted": 0}
        counts = {"evicted": await self.engine.ask(kept.clear)}
        if learned is not None:
            counts["evicted_disk"] = await trio.to_thread.run_sync(learned.evict)
        return counts

    async def lanes(self) -> list[dict[str, object]]:
        scheduler = self.engine.scheduler
        return await self.engine.ask(  # type: ignore[no-any-return]
            lambda: [lane.describe() for lane in [*scheduler.running, *scheduler.waiting]])

    async def close(self) -> None:
        """Stop the engine, then let the learned states offered be written."""
        await self.engine.close()
        learned = self.engine.runner.learned
        if learned is not None:
            await trio.to_thread.run_sync(learned.close)

"""Prometheus metrics of one daemon, on a registry of its own (tests run several in a process)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from tfd import __version__
from tfd.server.lifecycle import Lifecycle, Phase

if TYPE_CHECKING:  # the metrics load without torch
    from tfd.cache.kept import KeptCounts
    from tfd.store.store import StoreCounts

log = logging.getLogger("tfd.metrics")
CONTENT_TYPE = CONTENT_TYPE_LATEST
# Request latency buckets, seconds: from a cached /health to a long generation.
_LATENCY_BUCKETS = (0.001, 0.005, 0.02, 0.1, 0.5, 2.0, 10.0, 60.0, 300.0)
_STEP_BUCKETS = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)


class Metrics:
    """The daemon's counters; ``render`` gives the Prometheus text."""

    def __init__(self, lifecycle: Lifecycle) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        Info("tfd_build", "tfd's version", registry=self.registry).info({"version": __version__})
        self.requests = Counter(
            "tfd_http_requests", "HTTP requests answered, by route, method and status",
            ["route", "method", "status"], registry=self.registry,
        )
        self.latency = Histogram(
            "tfd_http_request_duration_seconds", "Time from request to the end of the response",
            ["route"], buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.in_flight = Gauge(
            "tfd_http_requests_in_flight", "HTTP requests being answered now", registry=self.registry,
        )
        self.refused = Counter(
            "tfd_http_refused", "Requests refused before running, by reason",
            ["reason"], registry=self.registry,
        )
        uptime = Gauge("tfd_uptime_seconds", "Seconds since the daemon started", registry=self.registry)
        uptime.set_function(lambda: lifecycle.uptime)
        phase = Gauge("tfd_state", "1 for the daemon's current state", ["state"], registry=self.registry)
        for each in Phase:
            phase.labels(each.value).set_function(_is_phase(lifecycle, each))
        running = Gauge("tfd_work_running", "Requests holding work a drain waits for",
                        registry=self.registry)
        running.set_function(lambda: lifecycle.running)

        self.tokens = Counter("tfd_tokens", "Tokens of finished requests, by kind", ["kind"],
                              registry=self.registry)
        self.finished = Counter("tfd_requests_finished", "Generation requests finished, by reason",
                                ["reason"], registry=self.registry)
        self.first_token = Histogram("tfd_time_to_first_token_seconds", "From arrival to the first token",
                                     buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.step = Histogram("tfd_step_seconds", "Engine step time", buckets=_STEP_BUCKETS,
                              registry=self.registry)
        self.step_rows = Counter("tfd_step_rows", "Token rows run by engine steps", registry=self.registry)
        self._drafts = Counter("tfd_drafts", "MTP drafts of finished requests, by kind: drafted (verified) "
                               "and accepted (held)", ["kind"], registry=self.registry)
        self._drafted = self._accepted = 0
        acceptance = Gauge("tfd_draft_acceptance", "Accepted over drafted MTP drafts since start (0 before "
                           "any)", registry=self.registry)
        acceptance.set_function(lambda: self._accepted / self._drafted if self._drafted else 0.0)
        self._pool = Gauge("tfd_pool_pages", "Pool pages, by state", ["state"], registry=self.registry)
        self._lanes = Gauge("tfd_lanes", "Lanes, by state", ["state"], registry=self.registry)
        self._compiled: Callable[[], tuple[str, ...]] | None = None
        self._seen = 0

    def watch(self, pages: Callable[[], tuple[int, int]], lanes: Callable[[], tuple[int, int]]) -> None:
        """Read the pool's (free, held) pages and the (running, waiting) lanes at each scrape."""
        self._pool.labels("free").set_function(lambda: pages()[0])
        self._pool.labels("held").set_function(lambda: pages()[1])
        self._lanes.labels("running").set_function(lambda: lanes()[0])
        self._lanes.labels("waiting").set_function(lambda: lanes()[1])

    def watch_kept(self, counts: KeptCounts) -> None:
        """Read the prompt cache's counts at each scrape (plain integers the engine thread moves)."""
        self.registry.register(_CountsCollector(counts, KEPT_FAMILIES))

    def watch_learned(self, counts: StoreCounts) -> None:
        """Read the disk store's counts at each scrape."""
        self.registry.register(_CountsCollector(counts, LEARNED_FAMILIES))

    def watch_compiles(self, compiled: Callable[[], tuple[str, ...]], at_ready: int) -> None:
        """Triton kernel variants compiled before READY (``at_ready``) and since, read at each scrape;
        each one compiled while serving is logged as a step ends: a request waited for it, so the
        warm-up missed its variant."""
        self._compiled, self._seen = compiled, at_ready
        family = Gauge("tfd_kernel_variants_compiled", "Triton kernel variants compiled, by when: "
                       "loading (through the warm-up) or serving", ["when"], registry=self.registry)
        family.labels("loading").set(at_ready)
        family.labels("serving").set_function(lambda: len(compiled()) - at_ready)

    def count_drafts(self, drafted: int, accepted: int) -> None:
        """A finished request's drafts: ``drafted`` verified, ``accepted`` of them held."""
        self._drafts.labels("drafted").inc(drafted)
        self._drafts.labels("accepted").inc(accepted)
        self._drafted += drafted
        self._accepted += accepted

    def on_step(self, seconds: float, rows: int) -> None:
        self.step.observe(seconds)
        self.step_rows.inc(rows)
        if self._compiled is not None and len(names := self._compiled()) > self._seen:
            log.warning("compiled while serving (the warm-up missed these variants): %s",
                        ", ".join(names[self._seen:]))
            self._seen = len(names)

    def render(self) -> bytes:
        return generate_latest(self.registry)


# A counter family read off a record of counts: its name, its help, its label, and (label value,
# attribute) pairs; a family of one unlabelled attribute has the label None.
Family = tuple[str, str, str | None, tuple[tuple[str, str], ...]]

KEPT_FAMILIES: tuple[Family, ...] = (
    ("tfd_prompt_cache_lookups", "Admissions that looked for a kept prompt state, by result", "result",
     (("hit", "hits"), ("miss", "misses"))),
    ("tfd_prompt_cache_states", "Prompt states kept, evicted, and refused (no pages, or over the budget "
     "alone)", "kind", (("kept", "kept"), ("evicted", "evicted"), ("refused", "refused"))),
    ("tfd_prompt_cache_resumed_tokens", "Prompt tokens resumed from kept states", None,
     (("", "resumed_tokens"),)),
)
LEARNED_FAMILIES: tuple[Family, ...] = (
    ("tfd_learned_states", "Learned states written, read back, refused (damaged or missing), refused by the "
     "daily budget or the free-space floor, evicted", "kind",
     tuple((kind, kind) for kind in ("written", "read", "refused", "daily_spent", "no_space", "evicted"))),
    ("tfd_learned_bytes", "Bytes of learned states, by direction", "direction",
     (("written", "bytes_written"), ("read", "bytes_read"))),
    ("tfd_learned_read_seconds", "Seconds spent reading learned states back: files read, copied to the "
     "device and checked", None, (("", "read_s"),)),
)


class _CountsCollector(Collector):
    """Counter families read off ``counts`` (plain integers another thread moves) at each scrape."""

    def __init__(self, counts: object, families: tuple[Family, ...]) -> None:
        self.counts = counts
        self.families = families

    def collect(self) -> Iterator[Metric]:
        for name, text, label, fields in self.families:
            if label is None:
                yield CounterMetricFamily(name, text, value=getattr(self.counts, fields[0][1]))
                continue
            family = CounterMetricFamily(name, text, labels=[label])
            for value, attribute in fields:
                family.add_metric([value], getattr(self.counts, attribute))
            yield family


def _is_phase(lifecycle: Lifecycle, phase: Phase) -> Callable[[], float]:
    return lambda: float(lifecycle.phase is phase)

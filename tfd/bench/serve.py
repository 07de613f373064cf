"""``tfd bench --serve URL``: a load generator against any running tfd, through its HTTP API.

Every request is a streamed ``/v1/completions`` of token ids (so prompt lengths are exact) that asks
for its new tokens with ``ignore_eos`` (so it gets exactly that many), greedy unless told, with
``return_token_ids`` (so each chunk says how many tokens it carries) and the usage chunk at the end.
By default it says ``"cache": false``, so the server prefills every prompt cold as the engine bench
does; ``--cache`` leaves its prompt cache in play.

A run is closed loop at a concurrency C (C clients, each sending its next request when its last one
finished, until N have; N == C sends them all at once) or open loop at a rate (N requests at Poisson
arrival times from a seeded generator, however many are in flight). Before each run, unless told
not to, an untimed warm round of C requests (open loop: up to 8) at the run's prompt lengths and at
most ``WARM_NEW`` new tokens. Each run prints a line and, with ``--out``, writes
``<model>-serve-<c|r>...json``: requests, errors by kind, output and request rates, TTFT, TPOT and
ITL (``tfd.bench.latency``) at p50/p90/p99, mean and max, drafts verified and accepted.

The client is one trio loop: a chunk costs it about 40 µs, mostly trio's wakeup (measured on the
H200 host against a fake server: 64 streams of 300 chunks a second took 66% of a core, its own lag
0.4 ms at the median and 4 ms at p99). Each run records ``client_cpu``, its share of a core, and
warns past ``BUSY_CLIENT``.

Error handling: a request that fails (an HTTP error status, an error event in the stream, a stream
cut before ``[DONE]``, a connection that fails, ``--timeout``) is counted by kind and the run goes
on; the exit status is 1 when any request of any run failed, after every run was written. A server
that does not answer at all is said so once, exit status 1. Resource handling: one connection pool
for the whole call (``tfd.bench.client``), closed at the end.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from tfd.bench.client import Events, ExchangeError, Pool, Target
from tfd.bench.latency import Timeline, lengths, poisson_arrivals
from tfd.bench.serve_record import Load, Outcome, Planned, Server, Spec, describe, line, revision, write

WARM_NEW = 4  # new tokens of a warm round's requests: a prefill and a few decode steps at the run's width
OPEN_WARM = 8  # an open-loop run's warm round, at most
FALLBACK_VOCAB = 256  # token ids every byte-level vocabulary has, when the server does not say its own
BUSY_CLIENT = 0.8  # of a core, past which a run warns that the client's own delays may show
TEXT_FILES = 32  # --text: held-out files long enough for the longest prompt, to cut prompts from


class Unreachable(Exception):
    """No server answered at the URL."""


async def server_info(pool: Pool) -> Server:
    """The model's name and context (``/v1/models``) and vocabulary (``/openapi.json``'s bound on
    token ids); a refusal (an API key wanted, say) is said on standard error and left None.
    ``Unreachable`` when nothing answers."""
    found: dict[str, Any] = {}
    for path in ("/v1/models", "/openapi.json"):
        try:
            answer = await pool.exchange("GET", path)
        except ExchangeError as error:
            raise Unreachable(f"no server answered at {pool.target.url}: {error}") from None
        if answer.status != 200:
            said = answer.body[:200].decode(errors="replace")
            print(f"tfd bench: GET {path} answered {answer.status}: {said}", file=sys.stderr)
            continue
        try:
            document = json.loads(answer.body)
            if path == "/v1/models":
                model = document["data"][0]
                found.update(model=model["id"], context=model.get("max_model_len"))
            else:
                schema = document["paths"]["/detokenize"]["post"]["requestBody"]["content"]
                found["vocab"] = schema["application/json"]["schema"]["properties"]["tokens"]["items"][
                    "maximum"] + 1
        except (ValueError, TypeError, KeyError, IndexError):
            print(f"tfd bench: GET {path}: not the answer tfd gives", file=sys.stderr)
    return Server(pool.target, found.get("model"), found.get("context"), found.get("vocab"))


async def held_out_prompts(pool: Pool, length: int, seed: int, enough: int = TEXT_FILES
                           ) -> list[tuple[int, ...]]:
    """Held-out files of the demo's training text (Python's standard library), in an order drawn from
    ``seed``, each tokenized by the server's own ``/tokenize``, until ``enough`` of them hold ``length``
    tokens (or every file is read). ``ValueError`` when the server refuses."""
    from tfd.train.corpus import is_validation, source_files, stdlib_root  # loads torch: --text only

    root = stdlib_root()
    held_out = [relative for relative in source_files(root) if is_validation(relative)]
    random.Random(seed).shuffle(held_out)
    found: list[tuple[int, ...]] = []
    for relative in held_out:
        try:
            text = (root / relative).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):  # the corpus skips them too
            continue
        if not text.strip():
            continue
        answer = await pool.exchange("POST", "/tokenize", json.dumps({"prompt": text}).encode())
        if answer.status != 200:
            raise ValueError(f"POST /tokenize answered {answer.status}: {answer.body[:200]!r}")
        found.append(tuple(json.loads(answer.body)["tokens"]))
        if sum(len(ids) >= length for ids in found) >= enough:
            break
    return found


def plan(load: Load, spec: Spec, server: Server, key: str, count: int,
         texts: Sequence[tuple[int, ...]] | None, new: tuple[int, int] | None = None) -> list[Planned]:
    """``count`` requests drawn from the seed and ``key`` alone: lengths, then prompt ids (random below
    the vocabulary, or cut from ``texts`` at random); ``new`` overrides the new tokens' range.
    ``ValueError`` when no text holds a drawn prompt length."""
    draw = random.Random(f"{load.seed}:{key}")
    prompts, news = lengths(load.prompt, count, draw), lengths(new or load.new, count, draw)
    vocab = server.vocab or FALLBACK_VOCAB
    planned = []
    for number, (length, tokens) in enumerate(zip(prompts, news, strict=True)):
        if texts is None:
            ids = draw.choices(range(vocab), k=length)
        else:
            long_enough = [text for text in texts if len(text) >= length]
            if not long_enough:
                raise ValueError(f"no held-out file holds {length} tokens")
            text = draw.choice(long_enough)
            start = draw.randint(0, len(text) - length)
            ids = list(text[start:start + length])
        body: dict[str, Any] = {"prompt": ids, "max_tokens": tokens, "stream": True,
                                "stream_options": {"include_usage": True}, "ignore_eos": True,
                                "return_token_ids": True, "temperature": load.temperature,
                                "seed": number, "cache": load.cache}
        if server.model is not None:
            body["model"] = server.model
        if spec.draft is not None:
            body["draft"] = spec.draft
        planned.append(Planned(length, tokens, json.dumps(body, separators=(",", ":")).encode()))
    return planned


async def send(pool: Pool, planned: Planned, limit_s: float) -> Outcome:
    """One streamed request to its end, for ``limit_s`` seconds at most; what went wrong is the
    outcome's ``error``."""
    outcome = Outcome(planned, Timeline(trio.current_time()))
    answer = None
    with trio.move_on_after(limit_s) as scope:
        try:
            events = Events(outcome.on_event)
            answer = await pool.exchange("POST", "/v1/completions", planned.payload, events.feed)
        except ExchangeError as error:
            outcome.fail(error.kind, str(error))
    outcome.ended = trio.current_time()
    if scope.cancelled_caught:
        outcome.fail("timeout", f"no end within {limit_s:g} s")
    elif answer is not None and answer.status != 200:
        said = answer.body.decode(errors="replace")
        outcome.fail(f"http {answer.status} {_code(answer.body)}".rstrip(), said)
    elif answer is not None and not answer.headers.get("content-type", "").startswith("text/event-stream"):
        outcome.fail("not a stream", answer.headers.get("content-type", ""))
    elif answer is not None and not outcome.done:
        outcome.fail("stream cut", "the stream ended without [DONE]")
    return outcome


def _code(body: bytes) -> str:
    """An error answer's ``error.code`` (the API's shape), else nothing."""
    try:
        return str(json.loads(body)["error"]["code"] or "")
    except (ValueError, TypeError, KeyError):
        return ""


async def closed_loop(pool: Pool, planned: Sequence[Planned], concurrency: int, limit_s: float
                      ) -> list[Outcome]:
    """``concurrency`` clients, each sending the next request when its last one ended."""
    outcomes: list[Outcome | None] = [None] * len(planned)
    queue = iter(range(len(planned)))  # shared: a client that finishes takes the next

    async def client() -> None:
        for index in queue:
            outcomes[index] = await send(pool, planned[index], limit_s)

    async with trio.open_nursery() as nursery:
        for _ in range(min(concurrency, len(planned))):
            nursery.start_soon(client)
    return [outcome for outcome in outcomes if outcome is not None]


async def open_loop(pool: Pool, planned: Sequence[Planned], arrivals: Sequence[float], limit_s: float
                    ) -> tuple[list[Outcome], int]:
    """Each request sent at its arrival time, whatever is in flight; the outcomes and the most in
    flight at once."""
    outcomes: list[Outcome] = []
    flying = most = 0

    async def one(planned_one: Planned) -> None:
        nonlocal flying, most
        flying += 1
        most = max(most, flying)
        try:
            outcomes.append(await send(pool, planned_one, limit_s))
        finally:
            flying -= 1

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for planned_one, at in zip(planned, arrivals, strict=True):
            await trio.sleep_until(start + at)
            nursery.start_soon(one, planned_one)
    return outcomes, most


async def run(pool: Pool, server: Server, load: Load, spec: Spec, number: int,
              texts: Sequence[tuple[int, ...]] | None, revision: str) -> dict[str, Any]:
    """One run, its warm round first: the run's JSON object."""
    warm_errors, opened = 0, pool.opened
    if load.warm:
        width = spec.concurrency if spec.concurrency is not None else min(OPEN_WARM, spec.requests)
        warm_new = (min(load.new[0], WARM_NEW), min(load.new[1], WARM_NEW))
        warm = plan(load, spec, server, f"warm-{number}", width, texts, warm_new)
        warm_errors = sum(o.error is not None for o in await closed_loop(pool, warm, width, load.timeout))
    planned = plan(load, spec, server, f"run-{number}", spec.requests, texts)
    began, cpu = trio.current_time(), time.process_time()
    if spec.rate is not None:
        arrivals = poisson_arrivals(spec.rate, spec.requests, load.seed * 1000 + number)
        outcomes, most = await open_loop(pool, planned, arrivals, load.timeout)
    else:
        assert spec.concurrency is not None
        outcomes = await closed_loop(pool, planned, spec.concurrency, load.timeout)
        most = min(spec.concurrency, spec.requests)
    seconds, cpu = max(o.ended for o in outcomes) - began, time.process_time() - cpu
    result = describe(server, load, spec, outcomes, seconds, revision)
    # the client's own share of a core: near 1, its delays show in the latencies it reports
    result.update(max_in_flight=most, warm_errors=warm_errors, connections=pool.opened - opened,
                  client_cpu=cpu / seconds if seconds > 0 else None)
    return result


async def serve_runs(target: Target, load: Load, specs: Sequence[Spec], out: Path | None,
                     commit: str | None = None) -> list[dict[str, Any]]:
    """Every run in turn against ``target``, a line each and a file each under ``out``.
    ``Unreachable`` when the server does not answer; ``ValueError`` when text prompts cannot be had."""
    pool = Pool(target)
    try:
        server = await server_info(pool)
        if server.vocab is None and not load.text:
            print(f"tfd bench: the server's vocabulary is unknown: prompt ids drawn below {FALLBACK_VOCAB}",
                  file=sys.stderr)
        texts = await held_out_prompts(pool, load.prompt[1], load.seed) if load.text else None
        commit = commit or revision()
        results = []
        for number, spec in enumerate(specs):
            result = await run(pool, server, load, spec, number, texts, commit)
            print(line(result), flush=True)
            if (result["client_cpu"] or 0) > BUSY_CLIENT:
                print(f"tfd bench: the client took {result['client_cpu']:.0%} of a core in this run: its own "
                      "delays may show in its latencies (ITL first)", file=sys.stderr)
            if out is not None:
                write(result, out)
            results.append(result)
        return results
    finally:
        await pool.aclose()

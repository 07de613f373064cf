"""``tfd bench --serve URL --write-conversation FILE`` and, after the server restarted,
``--resume-conversation FILE --concurrency C``: a conversation's second turn resumed from the server's
learned states while C - 1 other streams decode, as a client sees it.

Writing: turn one (``--prompt`` ids drawn from ``--seed``, ``--new`` tokens, greedy, the prompt cache in
play) is sent, and its prompt, its reply and a follow-up of ``FOLLOW_UP`` ids are written to FILE. A
server with TF_LEARN_CONVERSATIONS writes the turn's kept state to disk; SIGTERM waits for the write.
What comes between the two calls (the restart; the files dropped from the page cache, or not) is the
caller's: ``docs/bench/kit/resume_serve.sh`` does both.

Resuming: an untimed warm round of C - 1 short requests; then C - 1 streams of ``OTHER_PROMPT`` ids
(``"cache": false``) decode, and once each has ``SETTLE`` tokens turn two (turn one, its reply, the
follow-up) is sent with the cache in play. Measured: the others' seconds a token over the chunks that
came while turn two waited for its first token, against those before it was sent; turn two's first
token against (the server's read time, from /metrics' ``tfd_learned_read_seconds``, plus the first
token of its new tokens sent alone and cold); and turn two's tokens against the same prompt sent cold
(``"cache": false``) alone afterwards: resumed == fresh.

Error handling: a failed request, a server that resumed nothing from its disk (no restart between the
calls, another identity, no learned conversations), tokens that differ: the result says which, and
the exit status is 1. A FILE that is not a conversation this command wrote is a ``ValueError`` naming
it. Resource handling: one connection pool, closed at the end; the other streams are cancelled (their
connections closed, the server cancels them) once turn two has ended or failed.
"""

from __future__ import annotations

import datetime
import json
import math
import random
import re
import statistics
import sys
from pathlib import Path
from typing import Any

import attrs
import trio

from tfd import __version__
from tfd.bench.client import Events, ExchangeError, Pool, Target
from tfd.bench.latency import Timeline
from tfd.bench.serve import FALLBACK_VOCAB, WARM_NEW, closed_loop, plan, server_info
from tfd.bench.serve_record import Load, Outcome, Server, Spec

FOLLOW_UP = 64  # ids turn two adds after turn one's reply (a user's next message)
OTHER_PROMPT = 1024  # the decoding streams' prompts, at most a quarter of the context
OTHER_NEW = 4096  # their most new tokens (the context allowing): more than the measurement lasts; they are
# cancelled after it
SETTLE = 8  # tokens each other stream has before its gaps count: every one of them is decoding
BEFORE = 32  # tokens each other stream draws after that before turn two is sent
POLL_S = 0.005  # how often the client looks whether the others have settled
READ_SECONDS = "tfd_learned_read_seconds_total"
READ_STATES = 'tfd_learned_states_total{kind="read"}'
READ_BYTES = 'tfd_learned_bytes_total{direction="read"}'


@attrs.frozen
class Conversation:
    """Turn one as it was sent and answered, and the follow-up turn two adds."""

    model: str | None
    prompt: tuple[int, ...]
    reply: tuple[int, ...]
    follow_up: tuple[int, ...]

    @property
    def second(self) -> tuple[int, ...]:
        return self.prompt + self.reply + self.follow_up

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"tfd_conversation": 1, **attrs.asdict(self)}) + "\n")

    @classmethod
    def load(cls, path: Path) -> Conversation:
        """The conversation ``--write-conversation`` wrote to ``path``; ``ValueError`` naming it otherwise."""
        try:
            found = json.loads(path.read_text())
            if found.pop("tfd_conversation") != 1:
                raise ValueError("another version")
            return cls(found["model"], *(tuple(int(i) for i in found[key])
                                         for key in ("prompt", "reply", "follow_up")))
        except (OSError, ValueError, TypeError, KeyError) as error:
            raise ValueError(f"{path}: not a conversation tfd bench --write-conversation wrote ({error})") \
                from None


@attrs.define
class Turn:
    """One streamed request whose ids are kept: when it was sent, its first token, its end."""

    sent: float
    ids: list[int] = attrs.Factory(list)
    first_at: float | None = None
    cached: int | None = None
    error: str | None = None
    done: bool = False
    ended: float | None = None

    def on_event(self, data: bytes, at: float) -> None:
        if data == b"[DONE]":
            self.done = True
            return
        try:
            event = json.loads(data)
            if error := event.get("error"):
                self.error = self.error or f"stream {error.get('code')}: {error.get('message')}"
            for choice in event.get("choices") or ():
                if ids := choice.get("token_ids"):
                    self.first_at = at if self.first_at is None else self.first_at
                    self.ids.extend(int(i) for i in ids)
            if usage := event.get("usage"):
                self.cached = int(usage["prompt_tokens_details"]["cached_tokens"])
        except (ValueError, TypeError, AttributeError, KeyError) as error:
            self.error = self.error or f"bad event ({error}): {data[:200]!r}"

    @property
    def ttft(self) -> float | None:
        return None if self.first_at is None else self.first_at - self.sent


async def turn(pool: Pool, server: Server, prompt: tuple[int, ...], new: int, cache: bool,
               limit_s: float) -> Turn:
    """``prompt`` streamed to its end (greedy, ``new`` tokens exactly), its ids kept."""
    body: dict[str, Any] = {"prompt": list(prompt), "max_tokens": new, "stream": True, "ignore_eos": True,
                            "stream_options": {"include_usage": True}, "return_token_ids": True,
                            "temperature": 0.0, "cache": cache}
    if server.model is not None:
        body["model"] = server.model
    found = Turn(trio.current_time())
    with trio.move_on_after(limit_s) as scope:
        try:
            answer = await pool.exchange("POST", "/v1/completions", json.dumps(body).encode(),
                                         Events(found.on_event).feed)
            if answer.status != 200:
                found.error = f"http {answer.status}: {answer.body[:300].decode(errors='replace')}"
        except ExchangeError as error:
            found.error = str(error)
    found.ended = trio.current_time()
    if scope.cancelled_caught:
        found.error = f"timeout: no end within {limit_s:g} s"
    elif found.error is None and not found.done:
        found.error = "stream cut: the stream ended without [DONE]"
    return found


async def first_turn(target: Target, load: Load) -> Conversation:
    """Turn one sent (see the module); ``ValueError`` saying why when it failed."""
    pool = Pool(target)
    try:
        server = await server_info(pool)
        draw = random.Random(f"{load.seed}:conversation")
        vocab = server.vocab or FALLBACK_VOCAB
        prompt = tuple(draw.choices(range(vocab), k=load.prompt[0]))
        follow_up = tuple(draw.choices(range(vocab), k=FOLLOW_UP))
        first = await turn(pool, server, prompt, load.new[0], True, load.timeout)
    finally:
        await pool.aclose()
    if first.error is not None:
        raise ValueError(f"turn one failed: {first.error}")
    return Conversation(server.model, prompt, tuple(first.ids), follow_up)


def write_conversation(target: Target, load: Load, path: Path) -> int:
    """``--write-conversation``: turn one sent and written to ``path``; the exit status."""
    conversation = trio.run(first_turn, target, load)
    conversation.save(path)
    print(f"turn one: {len(conversation.prompt)} prompt tokens, {len(conversation.reply)} drawn; turn two "
          f"({len(conversation.second)} tokens) written to {path}", flush=True)
    return 0


def metric(text: str, name: str) -> float:
    """A sample's value in a Prometheus text exposition (0 when absent: a counter not yet moved)."""
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] == " ":
            return float(line.split()[-1])
    return 0.0


async def read_counts(pool: Pool) -> dict[str, float]:
    """The server's learned-state read counters (``ValueError`` when /metrics does not answer)."""
    answer = await pool.exchange("GET", "/metrics")
    if answer.status != 200:
        raise ValueError(f"GET /metrics answered {answer.status}: the read time comes from there")
    text = answer.body.decode()
    return {"read_s": metric(text, READ_SECONDS), "states": metric(text, READ_STATES),
            "bytes": metric(text, READ_BYTES)}


def gaps_per_token(others: list[Outcome], start: float, stop: float) -> list[float]:
    """Each other stream's gaps between chunks whose later chunk came in (start, stop], a token's share."""
    found = []
    for outcome in others:
        line = outcome.timeline
        for before, at, count in zip(line.arrivals, line.arrivals[1:], line.counts[1:], strict=False):
            if start < at <= stop:
                found.append((at - before) / count)
    return found


def resume_conversation(target: Target, load: Load, concurrency: int, draft: bool | None, path: Path,
                        out: Path | None, commit: str) -> int:
    """``--resume-conversation``: turn two of ``path``'s conversation beside ``concurrency - 1``
    decoding streams (see the module); a line, a JSON file under ``out``; the exit status."""
    conversation = Conversation.load(path)
    result = trio.run(resume_beside, target, load, concurrency, draft, conversation)
    result.update(conversation=str(path), commit=commit)
    print(line(result), flush=True)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", result["model"] or "server")
        (out / f"{name}-serve-resume-c{concurrency}-{len(conversation.second)}.json").write_text(
            json.dumps(result, indent=2) + "\n")
    for problem in result["problems"]:
        print(f"tfd bench: {problem}", file=sys.stderr)
    return 1 if result["problems"] else 0


async def resume_beside(target: Target, load: Load, concurrency: int, draft: bool | None,
                        conversation: Conversation) -> dict[str, Any]:
    """The measurement's JSON object; ``ValueError`` for a conversation written against another model."""
    pool = Pool(target)
    try:
        server = await server_info(pool)
        if conversation.model is not None and server.model not in (None, conversation.model):
            raise ValueError(f"the conversation was written against model {conversation.model!r}, the server "
                             f"serves {server.model!r}")
        result = await _measured(pool, server, load, concurrency, draft, conversation)
    finally:
        await pool.aclose()
    result.update(url=target.url, model=server.model, concurrency=concurrency, draft=draft,
                  tfd_version=__version__,
                  date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
    return result


async def _measured(pool: Pool, server: Server, load: Load, concurrency: int, draft: bool | None,
                    conversation: Conversation) -> dict[str, Any]:
    context = server.context or OTHER_PROMPT + OTHER_NEW
    prompt = min(OTHER_PROMPT, context // 4)  # a small server's context holds them too
    others_load = attrs.evolve(load, prompt=(prompt, prompt), new=(min(OTHER_NEW, context - prompt),) * 2,
                               cache=False, text=False)
    spec = Spec(concurrency - 1, concurrency=concurrency - 1, draft=draft)
    if load.warm:
        warm = plan(others_load, spec, server, "resume-warm", concurrency - 1, None, (WARM_NEW, WARM_NEW))
        await closed_loop(pool, warm, concurrency - 1, load.timeout)
    planned = plan(others_load, spec, server, "resume-others", concurrency - 1, None)
    before = await read_counts(pool)
    others = [Outcome(planned_one, Timeline(math.nan)) for planned_one in planned]

    async def other(outcome: Outcome) -> None:  # cancelled once turn two ends: its connection closes
        outcome.timeline.sent = trio.current_time()
        try:
            await pool.exchange("POST", "/v1/completions", outcome.planned.payload,
                                Events(outcome.on_event).feed)
        except ExchangeError as error:
            outcome.fail(error.kind, str(error))
        outcome.ended = trio.current_time()

    async with trio.open_nursery() as nursery:
        for outcome in others:
            nursery.start_soon(other, outcome)
        settled = await _until(others, SETTLE)
        await _until(others, SETTLE + BEFORE)
        second = await turn(pool, server, conversation.second, len(conversation.reply), True, load.timeout)
        nursery.cancel_scope.cancel()
    after = await read_counts(pool)
    cold = await _cold(pool, server, conversation, second, load.timeout)
    return _result(conversation, others, second, settled, before, after, cold)


async def _until(others: list[Outcome], tokens: int) -> float:
    """When every other stream has ``tokens`` tokens (or has ended)."""
    while not all(o.timeline.tokens >= tokens or not math.isnan(o.ended) for o in others):  # noqa: ASYNC110
        await trio.sleep(POLL_S)  # the streams' sinks count tokens and set no event
    return trio.current_time()


async def _idle(pool: Pool, limit_s: float) -> None:
    """Until the server holds no request's work (/metrics' ``tfd_work_running``): the cancelled
    streams gone, so that what runs next runs alone."""
    with trio.move_on_after(limit_s):
        while True:
            answer = await pool.exchange("GET", "/metrics")
            if answer.status != 200 or metric(answer.body.decode(), "tfd_work_running") == 0:
                return
            await trio.sleep(POLL_S)


async def _cold(pool: Pool, server: Server, conversation: Conversation, second: Turn, limit_s: float
                ) -> dict[str, Any]:
    """Alone, ``"cache": false``: turn two's new tokens (those past what it resumed), their first
    token's time; then the whole of turn two, its tokens and first token's time."""
    await _idle(pool, limit_s)
    new_only = await turn(pool, server, conversation.second[second.cached or 0:], 1, False, limit_s)
    fresh = await turn(pool, server, conversation.second, len(conversation.reply), False, limit_s)
    return {"new": new_only, "fresh": fresh}


def _median_ms(gaps: list[float]) -> float | None:
    return 1e3 * statistics.median(gaps) if gaps else None


def _result(conversation: Conversation, others: list[Outcome], second: Turn, settled: float,
            before: dict[str, float], after: dict[str, float], cold: dict[str, Turn]) -> dict[str, Any]:
    new_only, fresh = cold["new"], cold["fresh"]
    read = {key: after[key] - before[key] for key in before}
    problems = [f"an other stream failed: {o.error}: {o.detail}" for o in others if o.error is not None][:1]
    problems += [f"{name} failed: {t.error}" for name, t in (("turn two", second), ("its new tokens alone",
                 new_only), ("turn two cold", fresh)) if t.error is not None]
    first = second.first_at if second.first_at is not None else math.inf
    if any(o.ended < first for o in others):
        problems.append("an other stream ended before turn two's first token")
    if not read["states"]:
        problems.append("the server read no learned state back: turn two resumed from its memory or not at "
                        "all (restart it between --write-conversation and --resume-conversation, with "
                        "TF_LEARN_CONVERSATIONS=1 and the same identity)")
    equal = second.ids == fresh.ids and fresh.error is None
    if not equal:
        problems.append("turn two resumed drew other tokens than turn two cold")
    gaps_before = gaps_per_token(others, settled, second.sent)
    gaps_during = gaps_per_token(others, second.sent, first)
    gaps_after = gaps_per_token(others, first, second.ended or first)
    outside = _median_ms(gaps_before + gaps_after)
    during = _median_ms(gaps_during)
    bound = read["read_s"] + (new_only.ttft or 0.0)
    return {
        "prompt_tokens": len(conversation.prompt), "turn2_prompt_tokens": len(conversation.second),
        "new_tokens": len(conversation.reply), "cached_tokens": second.cached,
        "states_read": int(read["states"]), "bytes_read": int(read["bytes"]), "read_s": read["read_s"],
        "new_tokens_cold_s": new_only.ttft, "ttft_s": second.ttft,
        "ttft_over_read_and_new": second.ttft / bound if second.ttft is not None and bound else None,
        "fresh_ttft_s": fresh.ttft,
        "others": len(others), "others_ms_per_token_before": _median_ms(gaps_before),
        "others_ms_per_token_during": during, "others_ms_per_token_after": _median_ms(gaps_after),
        "others_gaps_during": len(gaps_during),
        "others_gap_ratio": during / outside if during is not None and outside else None,
        "tokens_equal": equal, "problems": problems,
    }


def line(result: dict[str, Any]) -> str:
    def num(value: float | None, form: str) -> str:
        return "-" if value is None else format(value, form)

    return (f"resume c{result['concurrency']} {result['turn2_prompt_tokens']} tokens: "
            f"cached {result['cached_tokens']}, read {result['bytes_read'] / 2**20:.0f} MiB in "
            f"{result['read_s']:.3f} s; TTFT {num(result['ttft_s'], '.3f')} s = "
            f"{num(result['ttft_over_read_and_new'], '.2f')}x (read + its new tokens cold "
            f"{num(result['new_tokens_cold_s'], '.3f')} s), cold {num(result['fresh_ttft_s'], '.3f')} s; "
            f"the others' ms a token {num(result['others_ms_per_token_before'], '.2f')} before, "
            f"{num(result['others_ms_per_token_during'], '.2f')} during ({result['others_gaps_during']} "
            f"gaps, {num(result['others_gap_ratio'], '.2f')}x outside), "
            f"{num(result['others_ms_per_token_after'], '.2f')} after; tokens "
            + ("equal" if result["tokens_equal"] else "DIFFER"))

"""``tfd conformance --soak SECONDS --clients N [--requests R]``: a live server under a random mix.

Each client, a thread of its own, sends request after request until the time is up, or until it has
sent its share of ``R`` requests (the clients share them out evenly, so the mix is the same
whatever the machine's speed: the suite's soak is bounded by requests, a deployment's by time): chat or text
completion, prompts of random length, random sampling (greedy, seeded, top-p/top-k cuts), drafts
on or off, the prompt cache used or bypassed, whole replies or streams, now and then a
conversation's next turn (so states are resumed) and now and then a client that leaves mid-prefill
or mid-decode. It counts requests, tokens and errors by kind; at the end it waits for the server to
settle and compares the admin census with the one at the start (pages or lanes not back are leaks)
and reports memory (admin ``status``) at the start, once settled (after the first fifth of its time
or requests: a server's memory first grows with the load, its connections and allocator arenas)
and at the end.

A soak passes when no request failed on the server's side (a 5xx other than the queue being full,
a broken stream, a connection error), nothing leaked and, with ``flat``, no memory grew by more
than that share from settled to the end. Resource handling: every connection is closed by the
client call that opened it; the threads end by the deadline plus one request; the memory sampler
ends with them.
"""

from __future__ import annotations

import collections
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs

from tfd.conformance.client import Client
from tfd.conformance.gates import SETTLE_S, TOPICS

WORDS = ("def", "return", "for", "while", "class", "import", "with", "yield", "lambda", "value", "items",
         "index", "result", "error", "count", "path", "line", "data", "self", "None", "True", "list")
ROUTES = ("/v1/completions", "/v1/chat/completions")
SETTLED_SHARE = 0.2  # memory is settled once this share of the time or the requests is behind


@attrs.define
class Tally:
    """What the clients saw, under a lock: requests, tokens drawn, answers by kind."""

    requests: int = 0
    tokens: int = 0
    left: int = 0  # clients that went away mid-request on purpose
    answers: collections.Counter[str] = attrs.Factory(collections.Counter)
    lock: threading.Lock = attrs.Factory(threading.Lock)

    def add(self, kind: str, tokens: int = 0, left: bool = False) -> None:
        with self.lock:
            self.requests += 1
            self.tokens += tokens
            self.left += left
            self.answers[kind] += 1


@attrs.frozen
class SoakReport:
    seconds: float  # how long the clients ran
    clients: int
    requests: int
    tokens: int
    left: int
    answers: dict[str, int]  # "200", "400 context_length_exceeded", "error ConnectionResetError"...
    failures: int  # answers that count against the server
    leaks: dict[str, Any]  # census fields not back to the start: {field: [start, end]}
    memory: dict[str, dict[str, int]]  # {"start": ..., "settled": ..., "end": ...}
    flat: float | None = None  # the growth from settled to the end allowed each measure (0.02: 2%)

    @property
    def growth(self) -> dict[str, float]:
        """Each measure's growth from settled to the end, as a share of settled."""
        settled, end = self.memory.get("settled", {}), self.memory.get("end", {})
        return {name: end[name] / value - 1 for name, value in settled.items() if name in end and value}

    @property
    def ok(self) -> bool:
        flat = self.flat is None or all(grown <= self.flat for grown in self.growth.values())
        return self.failures == 0 and not self.leaks and flat

    def lines(self) -> list[str]:
        mib = {when: {name: round(value / 2**20, 1) for name, value in found.items()}
               for when, found in self.memory.items()}
        grown = ", ".join(f"{name} {share:+.2%}" for name, share in self.growth.items()) or "nothing measured"
        limit = "" if self.flat is None else f" (at most {self.flat:.0%} each)"
        return [f"soak: {self.clients} clients for {self.seconds:.0f} s: {self.requests} requests "
                f"({self.left} left on purpose), {self.tokens} tokens",
                "answers: " + ", ".join(f"{kind} x{n}" for kind, n in sorted(self.answers.items())),
                f"failures: {self.failures}; leaks: {self.leaks or 0}",
                f"memory (MiB) at the start {mib.get('start')}, settled {mib.get('settled')}, "
                f"at the end {mib.get('end')}",
                f"grown since settled: {grown}{limit}",
                "soak holds" if self.ok else "SOAK FAILED"]


def failed(kind: str) -> bool:
    """An answer that counts against the server: a 5xx (a full queue aside) or a broken exchange."""
    if kind == "left":
        return False
    if kind.startswith("error"):
        return True
    status = int(kind.split()[0])
    return status >= 500 and "queue_full" not in kind


def soak(client: Client, seconds: float, clients: int, seed: int = 0, requests: int | None = None,
         flat: float | None = None) -> SoakReport:
    """Run the mix for ``seconds`` with ``clients`` threads, each stopping sooner once it has sent
    its share of ``requests`` (None: no bound); the census at both ends, memory at the start, once
    settled and at the end; ``flat``: the memory growth from settled to the end allowed."""
    at_start, memory_start = client.census(), client.admin("status")["memory"]
    tally = Tally()
    began = time.monotonic()
    deadline = began + seconds
    shares = [None] * clients if requests is None else \
        [requests // clients + (number < requests % clients) for number in range(clients)]
    done = threading.Event()
    settled: list[dict[str, int]] = []
    with ThreadPoolExecutor(clients + 1) as pool:
        sampler = pool.submit(_settled, client, tally, began + seconds * SETTLED_SHARE,
                              None if requests is None else requests * SETTLED_SHARE, done, settled)
        try:
            running = [pool.submit(_client, client, tally, deadline, random.Random(seed * 1000 + number),
                                   share) for number, share in enumerate(shares)]
            for one in running:
                one.result()  # a client's own fault (the kit's) is raised, not lost
        finally:
            done.set()
        sampler.result()
    took = time.monotonic() - began
    at_end = client.settled(at_start, SETTLE_S)
    leaks = {name: [at_start[name], at_end[name]] for name in at_start if at_end.get(name) != at_start[name]}
    answers = dict(tally.answers)
    return SoakReport(took, clients, tally.requests, tally.tokens, tally.left, answers,
                      sum(n for kind, n in answers.items() if failed(kind)), leaks,
                      {"start": memory_start, "settled": settled[0] if settled else memory_start,
                       "end": client.admin("status")["memory"]}, flat)


def _settled(client: Client, tally: Tally, at: float, after: float | None, done: threading.Event,
             into: list[dict[str, int]]) -> None:
    """Memory into ``into`` once the time ``at`` is reached or ``after`` requests are sent, whichever
    comes first; nothing if the clients are done before."""
    while not done.wait(0.2):
        if time.monotonic() >= at or (after is not None and tally.requests >= after):
            into.append(client.admin("status")["memory"])
            return


def _client(client: Client, tally: Tally, deadline: float, draw: random.Random, share: int | None) -> None:
    """One client's requests until ``deadline`` or its ``share`` of requests; a conversation goes on
    from its last reply."""
    history: list[dict[str, str]] = []
    sent = 0
    while time.monotonic() < deadline and (share is None or sent < share):
        sent += 1
        path = draw.choice(ROUTES)
        body = _body(draw, path, history)
        try:
            if draw.random() < 0.1:  # a long reply, so the server is still at it when the client goes
                long = {**body, "max_tokens": draw.randint(256, 512), "ignore_eos": True}
                client.leave(path, long, after_chunks=draw.choice((1, 2, 4)))
                tally.add("left", left=True)
                continue
            if body.get("stream"):
                status, events = client.stream(path, {**body, "stream_options": {"include_usage": True}})
                answer = events[-1] if events else {}
                if status == 200 and any("error" in event for event in events):
                    tally.add("error stream")
                    continue
            else:
                found = client.post(path, body)
                status, answer = found.status, found.body
        except (OSError, ValueError) as error:
            tally.add(f"error {type(error).__name__}")
            continue
        try:
            code = answer["error"]["code"] if status != 200 else None
            tokens = int(answer["usage"]["completion_tokens"]) if status == 200 else 0
            history = _next_turn(path, body, answer, history, draw) if status == 200 else []
        except (KeyError, TypeError, IndexError):  # not the shape the API promises
            tally.add(f"error answer {status}")
            continue
        tally.add(f"{status} {code}" if code else str(status), tokens)


def _body(draw: random.Random, path: str, history: list[dict[str, str]]) -> dict[str, Any]:
    words = " ".join(draw.choice(WORDS) for _ in range(draw.randint(1, 60)))
    text = f"# {draw.choice(TOPICS)}\n{words}\n"
    body: dict[str, Any] = {"max_tokens": draw.randint(1, 48), "stream": draw.random() < 0.4,
                            "draft": draw.random() < 0.7, "cache": draw.random() < 0.9,
                            "ignore_eos": draw.random() < 0.5}
    body.update(draw.choice(({"temperature": 0.0}, {"temperature": 0.8, "seed": draw.randint(0, 1 << 30)},
                             {"temperature": 1.0, "top_p": 0.9, "top_k": 20},
                             {"temperature": 0.7, "min_p": 0.05})))
    if path == "/v1/completions":
        return {**body, "prompt": text}
    return {**body, "messages": [*history, {"role": "user", "content": text}]}


def _next_turn(path: str, body: dict[str, Any], answer: dict[str, Any], history: list[dict[str, str]],
               draw: random.Random) -> list[dict[str, str]]:
    """The conversation the next chat goes on from: this one and its reply, half the time."""
    if path != "/v1/chat/completions" or body.get("stream") or draw.random() < 0.5 or len(history) > 6:
        return []
    reply = answer["choices"][0]["message"]["content"]
    return [*body["messages"], {"role": "assistant", "content": reply}]

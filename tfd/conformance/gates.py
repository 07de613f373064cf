"""The contract's gates, run against a live server through its HTTP API and admin socket.

Each gate sends requests and returns rows (``tfd.conformance.report``), each request drawn greedily,
seeded, with penalties and under a JSON Schema's grammar (``SAMPLINGS``): repeat (the same request
twice, the same tokens), concurrent == solo (1 to 8 requests side by side, each as it was alone),
drafted == plain (``"draft": false`` the reference), resumed == fresh (a conversation's second turn
from the prompt cache against ``"cache": false``), refusals (each bad input's status and code),
cancel (clients leaving mid-prefill, mid-decode and while queued; then the census is the one at
the start) and evict (after admin ``evict`` a second turn starts fresh and still answers the same).
Generations are fixed-length (``ignore_eos``) so that every reply has the same tokens to compare,
but a grammar's, which ends where the grammar does. Tool calls are ``tfd.conformance.tool_gate``'s.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs

from tfd.conformance.client import Answer, Client
from tfd.conformance.report import Row

# JSON of bounded size: a reply under the grammar ends on its own, within a profile's new tokens or not
SUMMARY = {"type": "object", "properties": {
    "topic": {"type": "string", "maxLength": 12}, "lines": {"type": "integer", "minimum": 1, "maximum": 40},
    "tags": {"type": "array", "items": {"enum": ["short", "python", "io", "math"]}, "maxItems": 3}},
    "required": ["topic", "lines", "tags"], "additionalProperties": False}
# how each request is drawn: plainly, with penalties, under a JSON Schema's grammar (which decides where
# the reply ends: no ignore_eos)
SAMPLINGS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0},
    "seeded": {"temperature": 0.9, "top_p": 0.95, "seed": 7},
    "penalized": {"temperature": 0.9, "seed": 11, "frequency_penalty": 0.4, "presence_penalty": 0.3,
                  "repetition_penalty": 1.1},
    "json": {"temperature": 0.9, "seed": 13, "ignore_eos": False, "response_format": {
        "type": "json_schema", "json_schema": {"name": "summary", "schema": SUMMARY}}},
}
TOPICS = ("a function that sums a list", "a class for a bank account", "reading a file line by line",
          "a binary search", "parsing command-line flags", "a retry with backoff", "merging two dicts",
          "a context manager that times a block", "a generator of primes", "a tiny HTTP handler")
SETTLE_S = 30.0  # a cancel takes effect at the next step; the census may lag that long at most


@attrs.frozen
class Profile:
    name: str
    prompts: int
    levels: tuple[int, ...]
    drafts: tuple[bool, ...]  # the concurrent gate's draft settings
    conversations: int
    new_tokens: int


PROFILES = {"quick": Profile("quick", 3, (1, 2, 4), (True, False), 2, 12),
            "full": Profile("full", 10, (1, 2, 4, 8), (True, False), 4, 32)}


def prompt(index: int) -> str:
    return f"# {TOPICS[index % len(TOPICS)]}\ndef "


LEAD_LINE = "assert sorted(items) == list(range(len(items)))\n"
PAST_BUDGET = 16  # tokens a prompt's lead passes a sparse attention budget by, before any is drawn
AROUND_LEAD = 160  # a conversation's tokens beside its lead: the template, the words, a message


def lead_past(client: Client, profile: Profile) -> tuple[str, int | None, int]:
    """Text to begin every prompt with, so that a model with sparse attention (the server's
    ``sparse_attention_budget`` in /v1/models) is checked past its budget: lines of code until the
    server's /tokenize counts the budget and PAST_BUDGET more. Empty where the model has none.
    Returns the lead, the budget and the lead's tokens; ``ValueError`` when the server's context
    cannot hold a conversation of ``profile`` with it."""
    listed = client.get("/v1/models")
    budget = next(iter(listed.body.get("data", [])), {}).get("sparse_attention_budget")
    if listed.status != 200 or budget is None:
        return "", None, 0
    need, lines = int(budget) + PAST_BUDGET, 1
    while True:
        counted = client.post("/tokenize", {"prompt": LEAD_LINE * lines})
        if counted.status != 200:
            raise ValueError(f"/tokenize answered {counted.status} sizing a prompt past the budget")
        count = int(counted.body["count"])
        if count >= need:
            break
        lines += max(1, (need - count) * lines // max(count, 1))  # the lines still short, at this rate
    context = int(counted.body["max_model_len"])
    if count + AROUND_LEAD + 2 * profile.new_tokens > context:
        raise ValueError(f"the server's context of {context} tokens holds no conversation past its "
                         f"sparse attention budget of {budget} (a lead of {count} tokens)")
    return LEAD_LINE * lines, int(budget), count


class Gates:
    """The gates of ``profile`` against ``client``; ``solo`` holds each (prompt, sampling)'s tokens
    alone, as the repeat gate saw them; every prompt and conversation begins with ``lead``."""

    def __init__(self, client: Client, profile: Profile, lead: str = "") -> None:
        self.client = client
        self.profile = profile
        self.lead = lead
        self.solo: dict[tuple[int, str], str] = {}

    def complete(self, index: int, sampling: str, **extra: Any) -> Answer:
        body = {"prompt": self.lead + prompt(index), "max_tokens": self.profile.new_tokens,
                "ignore_eos": True, **SAMPLINGS[sampling], **extra}
        return self.client.post("/v1/completions", body)

    def repeat(self) -> list[Row]:
        rows = []
        for index in range(self.profile.prompts):
            for sampling in SAMPLINGS:
                first, second = (self.complete(index, sampling, cache=False) for _ in range(2))
                shas = [sha(first), sha(second)]
                self.solo[index, sampling] = shas[0]
                rows.append(Row("repeat", {"prompt": index, "sampling": sampling}, shas[0], shas[0] == shas[1]
                                and first.status == 200, "" if shas[0] == shas[1] else f"twice: {shas}"))
        return rows

    def concurrent(self) -> list[Row]:
        rows = []
        for level in self.profile.levels:
            for sampling in SAMPLINGS:
                for draft in self.profile.drafts:
                    indices = [i % self.profile.prompts for i in range(level)]
                    send = functools.partial(self.complete, sampling=sampling, cache=False, draft=draft)
                    answers = side_by_side(indices, send)
                    for slot, (index, answer) in enumerate(zip(indices, answers, strict=True)):
                        alone = self.solo[index, sampling]
                        key = {"prompt": index, "sampling": sampling, "concurrency": level, "slot": slot,
                               "drafts": draft}
                        rows.append(Row("concurrent", key, sha(answer), sha(answer) == alone,
                                        f"prompt {index} {sampling} at {level}: {sha(answer)} alone {alone}"))
        return rows

    def drafted(self) -> list[Row]:
        rows = []
        for index in range(self.profile.prompts):
            for sampling in SAMPLINGS:
                plain = self.complete(index, sampling, cache=False, draft=False)
                drafted = self.complete(index, sampling, cache=False, draft=True)
                counts = drafted.body.get("tfd", {})
                detail = (f"prompt {index} {sampling}: drafted {sha(drafted)} plain {sha(plain)} "
                          f"({counts.get('accepted')} of {counts.get('drafted')} drafts held)")
                for draft, answer in ((False, plain), (True, drafted)):
                    rows.append(Row("drafted", {"prompt": index, "sampling": sampling, "drafts": draft},
                                    sha(answer), sha(drafted) == sha(plain) and answer.status == 200, detail))
        return rows

    def conversation(self, index: int, sampling: str) -> tuple[list[dict[str, str]], Answer]:
        """A first turn, and the messages of the second."""
        first = [{"role": "system", "content": self.lead + "You write short Python. " * 8},
                 {"role": "user", "content": f"Write {TOPICS[index % len(TOPICS)]}."}]
        turn1 = self.chat(first, sampling)
        reply = turn1.body.get("choices", [{}])[0].get("message", {}).get("content", "")
        return [*first, {"role": "assistant", "content": reply},
                {"role": "user", "content": "Now make it shorter."}], turn1

    def chat(self, messages: list[dict[str, str]], sampling: str, **extra: Any) -> Answer:
        body = {"messages": messages, "max_tokens": self.profile.new_tokens, "ignore_eos": True,
                **SAMPLINGS[sampling], **extra}
        return self.client.post("/v1/chat/completions", body)

    def resumed(self) -> list[Row]:
        rows = []
        for index in range(self.profile.conversations):
            for sampling in SAMPLINGS:
                second, _ = self.conversation(index, sampling)
                resumed = self.chat(second, sampling)
                fresh = self.chat(second, sampling, cache=False)
                detail = (f"conversation {index} {sampling}: resumed ({cached(resumed)} cached) "
                          f"{sha(resumed)}, fresh {sha(fresh)}")
                rows.append(Row("resumed", {"conversation": index, "sampling": sampling}, sha(resumed),
                                sha(resumed) == sha(fresh) and resumed.status == 200, detail))
        return rows

    def evict(self) -> list[Row]:
        rows = []
        for sampling in SAMPLINGS:
            second, _ = self.conversation(0, sampling)
            self.chat(second, sampling)  # kept again
            self.client.admin("evict")
            after = self.chat(second, sampling)
            fresh = self.chat(second, sampling, cache=False)
            held = sha(after) == sha(fresh) and cached(after) == 0
            detail = f"{sampling}: after evict {cached(after)} cached, {sha(after)}, fresh {sha(fresh)}"
            rows.append(Row("evict", {"conversation": 0, "sampling": sampling}, sha(after), held, detail))
        return rows

    def refusals(self, context: int | None) -> list[Row]:
        long_prompt = "word " * (2 * context if context else 1 << 20)
        ok = {"prompt": "x", "max_tokens": 4}
        chat = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
        cases: list[tuple[str, Callable[[], Answer], int, str]] = [
            ("over-long", lambda: self.client.post("/v1/completions", {**ok, "prompt": long_prompt}),
             400, "context_length_exceeded"),
            ("malformed", lambda: self.client.post("/v1/completions", None, raw=b'{"prompt": '), 400, ""),
            ("unknown model", lambda: self.client.post("/v1/completions", {**ok, "model": "no-such-model"}),
             404, "model_not_found"),
            ("bad temperature", lambda: self.client.post("/v1/completions", {**ok, "temperature": "hot"}),
             400, "temperature"),
            ("bad top_p", lambda: self.client.post("/v1/completions", {**ok, "top_p": 0}), 400, "top_p"),
            ("n past 64", lambda: self.client.post("/v1/completions", {**ok, "n": 65}), 400, "n"),
            # refused by name until honoured, never ignored (tfd.server.unsupported)
            ("guided_grammar", lambda: self.client.post("/v1/chat/completions", {
                **chat, "guided_grammar": 'root ::= "a"'}), 400, "guided_grammar"),
            ("a schema keyword llguidance lacks", lambda: self.client.post("/v1/chat/completions", {
                **chat, "guided_json": {"type": "array", "uniqueItems": True}}), 400, "guided_json"),
            ("logit_bias past the vocabulary", lambda: self.client.post(
                "/v1/completions", {**ok, "logit_bias": {str(1 << 40): 10}}), 400, "logit_bias"),
        ]
        rows = []
        for name, send, status, says in cases:
            answer = send()
            error = answer.body.get("error", {})
            value = f"{answer.status} {error.get('code')} {error.get('param')}"
            held = answer.status == status and (not says or says in (error.get("code"), error.get("param")))
            rows.append(Row("refusals", {"refusal": name}, value, held,
                            f"{name}: {value}, want {status} {says}".strip()))
        return rows

    def cancel(self, at_start: dict[str, Any], lanes: int) -> list[Row]:
        """Clients that leave: once their request is queued (its first chunk, sent before any token;
        a long prompt, so it is likely still prefilling), mid-decode (three tokens in), and ``lanes``
        + 2 at once (some wait in the queue). Admin ``lanes`` is read as they leave: the row holds
        only if the requests were there (queued, prefilling or decoding as the case asks) and the
        census comes back to the start."""
        long_prompt = "def f(x):\n    return x\n" * 200
        body = {"prompt": prompt(0), "max_tokens": 512, "ignore_eos": True, "temperature": 0.0}
        seen: list[list[str]] = []

        def look() -> None:
            seen.append(sorted(lane["phase"] for lane in self.client.lanes()))

        path = "/v1/completions"
        cases: list[tuple[str, Callable[[], object], Callable[[list[str]], bool]]] = [
            ("mid-prefill", lambda: self.client.leave(path, {**body, "prompt": long_prompt}, 1, look),
             lambda phases: len(phases) == 1),
            ("mid-decode", lambda: self.client.leave(path, body, 4, look),
             lambda phases: phases == ["decode"]),
            ("while queued", lambda: self._flood(body, lanes + 2, look),
             lambda phases: "waiting" in phases),
        ]
        rows = []
        for name, leave, proof in cases:
            seen.clear()
            try:
                leave()
            except threading.BrokenBarrierError:
                seen.append(["a client never got its first chunk"])
            phases = seen[-1] if seen else []
            census = self.client.settled(at_start, SETTLE_S)
            value = "census at start" if census == at_start else "census differs"
            rows.append(Row("cancel", {"cancel": name}, value, census == at_start and proof(phases),
                            f"{name}: lanes as it left {phases}; census {census}, at start {at_start}"))
        return rows

    def _flood(self, body: dict[str, Any], count: int, look: Callable[[], None]) -> None:
        """``count`` clients at once (more than the server's lanes: some wait in its queue), each
        gone once all have their first chunk and ``look`` has run."""
        everyone = threading.Barrier(count, action=look, timeout=SETTLE_S)

        def arrive() -> None:
            everyone.wait()

        def client(_: int) -> None:
            self.client.leave("/v1/completions", body, 1, arrive)

        with ThreadPoolExecutor(count) as pool:
            list(pool.map(client, range(count)))


def side_by_side(indices: list[int], send: Callable[[int], Answer]) -> list[Answer]:
    """``send(i)`` for each of ``indices`` at once, a thread (a client) each; the answers in order."""
    with ThreadPoolExecutor(len(indices)) as pool:
        return list(pool.map(send, indices))


def sha(answer: Answer) -> str:
    """A reply's token sha, or what it said instead."""
    if answer.status != 200:
        return f"status {answer.status}"
    return str(answer.body.get("tfd", {}).get("token_sha"))


def cached(answer: Answer) -> int:
    return int(answer.body.get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens", 0) or 0)

"""``tfd bench --serve``'s records: what a call asks (``Load``, ``Spec``), what the server said
(``Server``), what each request saw (``Outcome``), and a run's JSON object, file name and line.

Pure Python without I/O but for ``write`` and ``revision`` (git's HEAD), so a plain ``--serve`` run
never imports torch.
"""

from __future__ import annotations

import collections
import datetime
import json
import math
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from tfd import __version__
from tfd.bench.client import Target
from tfd.bench.latency import Summary, Timeline

TOKEN_IDS = b'"token_ids": ['  # a chunk's token ids, as the server's json.dumps writes the key


@attrs.frozen
class Load:
    """What every request of a call looks like (the flags)."""

    prompt: tuple[int, int]  # lengths drawn uniformly from low to high, both included
    new: tuple[int, int]
    temperature: float = 0.0
    cache: bool = False
    text: bool = False
    seed: int = 0
    timeout: float = 600.0  # seconds a request may take, stream included
    warm: bool = True


@attrs.frozen
class Spec:
    """One run: closed loop at ``concurrency`` or open loop at ``rate``, ``requests`` of them;
    ``draft``: what the requests say (None: leave it to the server), ``drafts`` the count named."""

    requests: int
    concurrency: int | None = None
    rate: float | None = None
    draft: bool | None = None
    drafts: int = 0

    @property
    def mode(self) -> str:
        return "rate" if self.rate is not None else "concurrency"


@attrs.frozen
class Server:
    """What the server says about itself; None where it did not answer."""

    target: Target
    model: str | None
    context: int | None
    vocab: int | None


@attrs.frozen
class Planned:
    """A request ready to send: its lengths and its JSON body, encoded before the run starts."""

    prompt_tokens: int
    new_tokens: int
    payload: bytes


@attrs.define
class Outcome:
    """What one request saw."""

    planned: Planned
    timeline: Timeline
    error: str | None = None
    detail: str = ""  # what the server or the connection said, for the run's examples
    ended: float = math.nan
    done: bool = False  # [DONE] came
    tokens: int | None = None  # the usage chunk's completion tokens
    drafted: int = 0
    accepted: int = 0

    def fail(self, kind: str, detail: str = "") -> None:
        if self.error is None:  # the first thing that went wrong names it
            self.error, self.detail = kind, detail[:300]

    def on_event(self, data: bytes, at: float) -> None:
        """One server-sent event's data, arrived at ``at``: tokens, usage, ``[DONE]`` or an error."""
        if (start := data.find(TOKEN_IDS)) >= 0 and b'"usage"' not in data and b'"error"' not in data:
            # a token chunk, counted without parsing it: a key cannot occur inside a JSON string, whose
            # quotes are all escaped, so the match is the key; its ids are plain integers
            ids = data[start + len(TOKEN_IDS):data.find(b"]", start)]
            self.timeline.add(at, ids.count(b",") + 1 if ids.strip() else 0)
            return
        if data == b"[DONE]":
            self.done = True
            return
        try:
            event = json.loads(data)
            if error := event.get("error"):
                self.fail(f"stream {error.get('code') or 'error'}", str(error.get("message")))
                return
            if choices := event.get("choices"):
                ids = choices[0].get("token_ids")
                self.timeline.add(at, len(ids) if ids is not None else int(bool(choices[0].get("text"))))
            if usage := event.get("usage"):
                self.tokens = int(usage["completion_tokens"])
            if extra := event.get("tfd"):  # the last chunk's, with its finish_reason
                self.drafted, self.accepted = int(extra.get("drafted") or 0), int(extra.get("accepted") or 0)
        except (ValueError, TypeError, AttributeError, KeyError, IndexError):  # not the API's shape
            self.fail("bad event", data[:300].decode(errors="replace"))

    @property
    def output_tokens(self) -> int:
        return self.tokens if self.tokens is not None else self.timeline.tokens


def describe(server: Server, load: Load, spec: Spec, outcomes: Sequence[Outcome], seconds: float,
             revision: str) -> dict[str, Any]:
    """A run's JSON object from its requests' outcomes (failed ones count as errors only)."""
    good = [o for o in outcomes if o.error is None]
    errors = collections.Counter(o.error for o in outcomes if o.error is not None)
    examples = {o.error: o.detail for o in reversed(outcomes) if o.error is not None}  # the first of each
    output = sum(o.output_tokens for o in good)
    drafted, accepted = sum(o.drafted for o in good), sum(o.accepted for o in good)
    tpots = [t for o in good if (t := o.timeline.tpot(o.output_tokens)) is not None]
    return {
        "url": server.target.url, "model": server.model, "mode": spec.mode,
        "concurrency": spec.concurrency, "rate": spec.rate,
        "requests": len(outcomes), "completed": len(good), "errors": dict(sorted(errors.items())),
        "error_count": len(outcomes) - len(good), "error_examples": dict(sorted(examples.items())),
        "prompt_tokens": list(load.prompt), "new_tokens": list(load.new),
        "prompt_tokens_total": sum(o.planned.prompt_tokens for o in good), "output_tokens_total": output,
        "duration_s": seconds, "output_tok_s": output / seconds if seconds > 0 else None,
        "request_s": len(good) / seconds if seconds > 0 else None,
        "ttft_ms": Summary.of([t for o in good if (t := o.timeline.ttft()) is not None]).as_json(),
        "tpot_ms": Summary.of(tpots).as_json(),
        "itl_ms": Summary.of([gap for o in good for gap in o.timeline.itl()]).as_json(),
        "latency_ms": Summary.of([o.ended - o.timeline.sent for o in good]).as_json(),
        "temperature": load.temperature, "draft": spec.draft, "drafts": spec.drafts,
        "drafted": drafted, "accepted": accepted, "acceptance": accepted / drafted if drafted else None,
        "cache": load.cache, "text_prompts": load.text, "warm": load.warm, "seed": load.seed,
        "context": server.context, "vocab": server.vocab, "tfd_version": __version__, "commit": revision,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def run_name(result: dict[str, Any]) -> str:
    """``<model>-serve-c<C>|r<R>-n<N>x<prompt>-<new>[-d<drafts>|-nodraft]``: a run's file name."""
    model = re.sub(r"[^A-Za-z0-9._-]+", "_", result["model"] or "server")
    width = f"c{result['concurrency']}" if result["mode"] == "concurrency" else f"r{result['rate']:g}"
    prompt, new = ("to".join(map(str, dict.fromkeys(span))) for span in (result["prompt_tokens"],
                                                                          result["new_tokens"]))
    draft = {None: "", False: "-nodraft"}.get(result["draft"], f"-d{result['drafts']}")
    return f"{model}-serve-{width}-n{result['requests']}x{prompt}-{new}{draft}"


def line(result: dict[str, Any]) -> str:
    ttft, tpot, itl = result["ttft_ms"], result["tpot_ms"], result["itl_ms"]

    def ms(summary: dict[str, Any], *names: str) -> str:
        return "/".join("-" if summary[name] is None else f"{summary[name]:.1f}" for name in names)

    errors = ", ".join(f"{kind} x{n}" for kind, n in result["errors"].items())
    return (f"{run_name(result)}: {result['completed']}/{result['requests']} ok"
            + (f" ({errors})" if errors else "")
            + f", {result['output_tok_s'] or 0:.1f} out tok/s, {result['request_s'] or 0:.2f} req/s in "
            f"{result['duration_s']:.2f} s; p50/p90/p99 ms: TTFT {ms(ttft, 'p50', 'p90', 'p99')} (max "
            f"{ms(ttft, 'max')}), TPOT {ms(tpot, 'p50', 'p90', 'p99')} (mean {ms(tpot, 'mean')}), "
            f"ITL {ms(itl, 'p50', 'p90', 'p99')}"
            + (f"; drafts accepted {result['acceptance']:.1%}" if result["acceptance"] is not None else ""))


def write(result: dict[str, Any], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{run_name(result)}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def revision() -> str:
    """git's short HEAD of this checkout (or "unknown"), the revision every bench run records; no torch."""
    try:
        found = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                               check=True, cwd=Path(__file__).parent)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return found.stdout.strip()

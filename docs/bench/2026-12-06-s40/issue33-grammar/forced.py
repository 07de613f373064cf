"""Issue 33b: forced (one-token) grammar states vs llguidance's full mask fill.

Q1  per-lane full-fill cost by the state's allowed-set size (1; 2-16; 17-999; >=1000).
Q2  exactness: compute_ff_tokens() non-empty  =>  full mask == one-hot(ff[0])?  (and remembered ff[1:]
    at the next steps; and compute_ff_bytes non-empty => one-token mask?)
Q3  cost of the exact predictors (compute_ff_tokens, compute_ff_bytes, ...) vs the fill in those states.
Q4  32-lane cost per step: full fill for all (tfd's _fill) vs one-hot rows for forced lanes (remembered
    forced tokens across steps) + executor fill of the rest -- timed for real, rows checked bit-exact.

Walks: the bench's JSON workload (records_grammar) run on the CPU with the demo's trained and random
weights (tokens replayed), plus random walks over five other JSON schemas compiled with tfd's
Vocabulary(...).compile and json_rule.

Run: OMP_NUM_THREADS=1 RAYON_NUM_THREADS=1 .venv/bin/python .dev/issue33b/forced.py
Each measured API runs on a matcher group of its own (32 matchers compiled anew, own lexer caches), all
groups advanced by the same tokens, so no call finds a state another call already explored. Single
thread throughout (torch 1 thread, LLExecutor(num_threads=1)).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

import llguidance  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from tfd.bench.command import records_grammar  # noqa: E402
from tfd.engine.grammar import Vocabulary  # noqa: E402
from tfd.server.structured import closed, json_rule  # noqa: E402

HERE = Path(__file__).resolve().parent
VOCAB = 4096
WORDS = VOCAB // 32
LANES = 32
CLASSES = (("1", 1, 1), ("2-16", 2, 16), ("17-999", 17, 999), (">=1000", 1000, 10**9))

# one-hot rows, a token a row (bit t%32 of word t//32)
ONEHOT = np.zeros((VOCAB, WORDS), dtype=np.uint32)
ONEHOT[np.arange(VOCAB), np.arange(VOCAB) // 32] = (np.uint32(1) << (np.arange(VOCAB) % 32).astype(np.uint32))
ONEHOT = ONEHOT.view(np.int32)


def bits_of(rows: np.ndarray) -> np.ndarray:
    return np.unpackbits(rows.view(np.uint8), axis=-1, bitorder="little").astype(bool)[..., :VOCAB]


# ---------------------------------------------------------------- walks of the bench workload

def bench_tokens(label: str, random_weights: bool, new: int, compiled) -> list[list[int]]:
    """Each lane's tokens from the bench's own JSON workload on the CPU (cached under HERE)."""
    path = HERE / f"tokens-{label}.json"
    if path.exists():
        return json.loads(path.read_text())
    from tfd.bench.workload import Workload, run
    from tfd.checkpoint import Checkpoint
    from tfd.demo import build_demo
    from tfd.families.hybrid import HybridModel, load_model

    checkpoint = Checkpoint.open(build_demo("qwen3_5", HERE / "cache"))
    if random_weights:
        model = HybridModel.random(checkpoint.family, checkpoint.text_config, dtype=torch.float32,
                                   device="cpu", head=False)
    else:
        model = load_model(checkpoint, "cpu", torch.float32, progress=False)
    t0 = time.perf_counter()
    tokens = run(model, Workload(LANES, 1024, new, grammar=compiled, grammar_name="json"), graphs=False).tokens
    print(f"[{label}: bench workload {LANES}x1024-{new} json on CPU in {time.perf_counter() - t0:.1f}s]", flush=True)
    tokens = [list(map(int, t)) for t in tokens]
    path.write_text(json.dumps(tokens))
    return tokens


# ---------------------------------------------------------------- other schemas

def schemas() -> dict[str, dict]:
    nested = {"type": "object", "properties": {
        "user": {"type": "object", "properties": {
            "id": {"type": "integer"},
            "profile": {"type": "object", "properties": {
                "email": {"type": "string", "maxLength": 20}, "verified": {"type": "boolean"},
                "address": {"type": "object", "properties": {"zip": {"type": "string", "maxLength": 6},
                                                             "country": {"type": "string", "maxLength": 10}},
                            "required": ["zip", "country"]}},
                "required": ["email", "verified", "address"]}},
            "required": ["id", "profile"]},
        "meta": {"type": "object", "properties": {"score": {"type": "number"}, "note": {"type": "string",
                                                                                         "maxLength": 12}},
                 "required": ["score"]}},
        "required": ["user", "meta"]}
    enums = {"type": "object", "properties": {
        "colors": {"type": "array", "items": {"enum": ["red", "green", "blue", "cyan", "magenta", "yellow"]},
                   "minItems": 1, "maxItems": 6},
        "sizes": {"type": "array", "items": {"enum": ["S", "M", "L", "XL", "XXL"]}, "maxItems": 4},
        "kind": {"enum": ["alpha", "beta", "gamma", "alphabet"]}},
        "required": ["colors", "sizes", "kind"]}
    pattern = {"type": "object", "properties": {
        "phone": {"type": "string", "pattern": "^\\+1-[0-9]{3}-[0-9]{3}-[0-9]{4}$"},
        "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2,4}(-[a-z]+)?$"},
        "hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"},
        "slug": {"type": "string", "pattern": "^[a-z]+(_[a-z]+)*$", "maxLength": 16}},
        "required": ["phone", "code", "hex", "slug"]}
    numbers = {"type": "object", "properties": {
        "lat": {"type": "number", "minimum": -90, "maximum": 90},
        "count": {"type": "integer", "minimum": 10, "maximum": 9999},
        "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "temp": {"type": "integer", "minimum": -40, "maximum": 60},
        "big": {"type": "integer", "minimum": 1000000}},
        "required": ["lat", "count", "ratio", "temp", "big"]}
    optional = {"type": "object", "properties": {  # nothing required: keys are choices, not forced
        "alpha": {"type": "boolean"}, "beta": {"type": "integer", "minimum": 0, "maximum": 9},
        "gamma": {"anyOf": [{"type": "string", "maxLength": 6}, {"type": "null"}]},
        "delta": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}}}
    return {name: {"type": "array", "items": closed(s), "minItems": 40}
            for name, s in (("nested objects", nested), ("arrays of enums", enums),
                            ("strings with patterns", pattern), ("numbers with bounds", numbers),
                            ("optional keys + anyOf", optional))}


def structural_tokens(tokenizer) -> np.ndarray:
    """Tokens holding a JSON structural character: a random walk leans on them so objects close."""
    out = np.zeros(VOCAB, dtype=bool)
    for t in range(VOCAB):
        try:
            s = tokenizer.decode_bytes([t])
        except Exception:  # noqa: BLE001
            continue
        out[t] = any(c in s for c in (b'"', b",", b"}", b"]"))
    return out


# ---------------------------------------------------------------- lanes: matcher groups

class Group:
    def __init__(self, tokenizer, text: str) -> None:
        self.m = [llguidance.LLMatcher(tokenizer, text, log_level=0) for _ in range(LANES)]
        assert not any(m.is_error() for m in self.m)


class Bench:
    """Matcher groups a walk: F the executor's 32-lane fill (ground truth masks), S one-lane fills,
    T compute_ff_tokens, B compute_ff_bytes, BT compute_ff_bytes then (if non-empty) compute_ff_tokens,
    X scheme 'ff': remembered ff tokens / compute_ff_tokens / executor fill of the rest,
    Y scheme 'gated': remembered / compute_ff_bytes -> compute_ff_tokens / executor fill of the rest,
    Z scheme 'oracle lower bound': executor fill of the non-forced lanes only (predictor free)."""

    def __init__(self, tokenizer, text: str, rng: np.random.Generator) -> None:
        self.g = {k: Group(tokenizer, text) for k in ("F", "S", "T", "B", "BT", "X", "Y", "Z")}
        self.ex = llguidance.LLExecutor(num_threads=1)
        self.buf = {k: np.zeros((LANES, WORDS), dtype=np.int32) for k in ("F", "X", "Y", "Z")}
        self.one = np.zeros((1, WORDS), dtype=np.int32)
        self.rememb = {"X": [[] for _ in range(LANES)], "Y": [[] for _ in range(LANES)]}
        self.rng = rng

    # -- full fill, all lanes (tfd's _fill)
    def fill_all(self) -> int:
        buf = self.buf["F"]
        t0 = time.perf_counter_ns()
        self.ex.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(self.g["F"].m)], buf.ctypes.data,
                                        WORDS * 4, LANES)
        return time.perf_counter_ns() - t0

    def scheme(self, key: str, gated: bool) -> tuple[int, dict]:
        """One step of the shortcut for all lanes; ns, and what each lane took (cached/ff/fill)."""
        ms, buf, rem = self.g[key].m, self.buf[key], self.rememb[key]
        how = {}
        t0 = time.perf_counter_ns()
        rest = []
        for i, m in enumerate(ms):
            left = rem[i]
            if left:
                buf[i] = ONEHOT[left.pop(0)]
                how[i] = "cached"
                continue
            if gated and not m.compute_ff_bytes():
                rest.append((m, i))
                how[i] = "fill(no ff bytes)"
                continue
            ff = m.compute_ff_tokens()
            if ff:
                buf[i] = ONEHOT[ff[0]]
                rem[i] = ff[1:]
                how[i] = "ff"
            else:
                rest.append((m, i))
                how[i] = "fill(ff empty)"
        if rest:
            self.ex.unsafe_compute_mask_ptr(rest, buf.ctypes.data, WORDS * 4, LANES)
        return time.perf_counter_ns() - t0, how

    def oracle(self, forced: np.ndarray, tokens_now: list[int]) -> int:
        ms, buf = self.g["Z"].m, self.buf["Z"]
        t0 = time.perf_counter_ns()
        rest = []
        for i, m in enumerate(ms):
            if forced[i]:
                buf[i] = ONEHOT[tokens_now[i]]
            else:
                rest.append((m, i))
        if rest:
            self.ex.unsafe_compute_mask_ptr(rest, buf.ctypes.data, WORDS * 4, LANES)
        return time.perf_counter_ns() - t0

    def per_lane(self, i: int) -> dict:
        out = {}
        t0 = time.perf_counter_ns()
        self.g["S"].m[i].unsafe_compute_mask_ptr(self.one.ctypes.data, WORDS * 4)
        out["fill_us"] = (time.perf_counter_ns() - t0) / 1e3
        out["fill_row"] = self.one[0].copy()
        t0 = time.perf_counter_ns()
        out["ff"] = self.g["T"].m[i].compute_ff_tokens()
        out["ff_us"] = (time.perf_counter_ns() - t0) / 1e3
        t0 = time.perf_counter_ns()
        out["ffb"] = self.g["B"].m[i].compute_ff_bytes()
        out["ffb_us"] = (time.perf_counter_ns() - t0) / 1e3
        m = self.g["BT"].m[i]
        t0 = time.perf_counter_ns()
        if m.compute_ff_bytes():
            m.compute_ff_tokens()
        out["gate_us"] = (time.perf_counter_ns() - t0) / 1e3
        return out

    def take(self, i: int, token: int) -> None:
        for g in self.g.values():
            assert g.m[i].consume_token(token), token

    def stopped(self) -> bool:
        return any(m.is_stopped() for m in self.g["F"].m)


def walk(name: str, tokenizer, text: str, steps: int, choose, out) -> dict:
    """Walk 32 lanes ``steps`` steps; ``choose(lane, step, allowed_bool)`` gives each lane's token."""
    rng = np.random.default_rng(7)
    b = Bench(tokenizer, text, rng)
    rows, step_ns = [], {"full": [], "ff": [], "gated": [], "oracle": []}
    texts = [[] for _ in range(LANES)]
    counter = []  # counter-examples
    memo, memo_stats, ffb_multi = {}, dict(hits=0, conflicts=0, new=0), []  # (last token, ff bytes) -> ff tokens
    checks = dict(ff_states=0, ff_agree=0, cached_states=0, cached_agree=0, one_no_ff=0, ffb_states=0,
                  ffb_one=0, scheme_rows=0, scheme_rows_equal=0)
    for step in range(steps):
        if b.stopped():
            break
        # rotate the order in which the timed things run each step
        order = ["full", "ff", "gated"]
        order = order[step % 3:] + order[:step % 3]
        hows = {}
        for what in order:
            if what == "full":
                step_ns["full"].append(b.fill_all())
            elif what == "ff":
                ns, hows["X"] = b.scheme("X", gated=False)
                step_ns["ff"].append(ns)
            else:
                ns, hows["Y"] = b.scheme("Y", gated=True)
                step_ns["gated"].append(ns)
        truth = b.buf["F"]
        allowed = bits_of(truth)
        counts = allowed.sum(axis=1)
        for key in ("X", "Y"):
            eq = np.all(b.buf[key] == truth, axis=1)
            checks["scheme_rows"] += LANES
            checks["scheme_rows_equal"] += int(eq.sum())
            for i in np.flatnonzero(~eq):
                counter.append(f"{name} step {step} lane {i}: scheme {key} ({hows[key][i]}) row differs; text "
                               f"{tokenizer.decode_str(texts[i])[-80:]!r}; mask allows "
                               f"{np.flatnonzero(allowed[i])[:12].tolist()} ({counts[i]})")
        tokens_now = []
        for i in range(LANES):
            tokens_now.append(choose(i, step, allowed[i]))
        step_ns["oracle"].append(b.oracle(counts == 1, tokens_now))
        assert np.array_equal(b.buf["Z"], truth)
        for i in range(LANES):
            r = b.per_lane(i)
            assert np.array_equal(r["fill_row"], truth[i])
            ff, ffb, n = r["ff"], r["ffb"], int(counts[i])
            onehot_first = bool(ff) and n == 1 and bool(allowed[i][ff[0]])
            if ff:
                checks["ff_states"] += 1
                checks["ff_agree"] += onehot_first
                if not onehot_first:
                    counter.append(f"{name} step {step} lane {i}: ff {ff} but mask allows "
                                   f"{np.flatnonzero(allowed[i])[:12].tolist()} ({n}); text "
                                   f"{tokenizer.decode_str(texts[i])[-80:]!r}")
            elif n == 1:
                checks["one_no_ff"] += 1
            if ffb:
                checks["ffb_states"] += 1
                checks["ffb_one"] += n == 1
                if n != 1 and len(ffb_multi) < 3 and not any(e[0] == ffb for e in ffb_multi):
                    ffb_multi.append((ffb, tokenizer.decode_str(texts[i])[-50:],
                                      [tokenizer.decode_str([t]) for t in np.flatnonzero(allowed[i])[:8]], n))
                key = (texts[i][-1] if texts[i] else None, ffb)
                if key in memo:
                    memo_stats["hits"] += 1
                    if memo[key] != tuple(ff):
                        memo_stats["conflicts"] += 1
                        if memo_stats["conflicts"] <= 3:
                            counter_memo = (f"memo conflict {key!r}: before {memo[key]}, now {ff}; text "
                                            f"{tokenizer.decode_str(texts[i])[-60:]!r}")
                            out("   memo " + counter_memo)
                else:
                    memo[key] = tuple(ff)
                    memo_stats["new"] += 1
            if hows["X"][i] == "cached":
                checks["cached_states"] += 1
                checks["cached_agree"] += bool(np.array_equal(b.buf["X"][i], truth[i]))
            rows.append(dict(step=step, lane=i, n=n, fill=r["fill_us"], ff_us=r["ff_us"], ffb_us=r["ffb_us"],
                             gate_us=r["gate_us"], ff=len(ff), ffb=len(ffb), how=hows["X"][i],
                             howY=hows["Y"][i]))
        for i, t in enumerate(tokens_now):
            b.take(i, t)
            texts[i].append(t)
    report(name, rows, step_ns, checks, counter, out)
    for ffb, text, toks, n in ffb_multi:
        out(f"   ff_bytes non-empty, mask not one token: text ...{text!r}; ff_bytes {ffb!r}; mask allows {n}: {toks}")
    out(f"   (side check, NOT exact by construction) memo (last token, ff_bytes) -> ff_tokens over ff_bytes states: "
        f"{memo_stats['new']} keys, {memo_stats['hits']} repeats, {memo_stats['conflicts']} conflicting")
    return dict(rows=rows, step_ns=step_ns, checks=checks, counter=counter, memo=memo_stats)


def report(name: str, rows, step_ns, checks, counter, out) -> None:
    A = lambda k: np.array([r[k] for r in rows])  # noqa: E731
    n, fill, ff_us, ffb_us, gate_us = A("n"), A("fill"), A("ff_us"), A("ffb_us"), A("gate_us")
    ff_nonempty, ffb_nonempty = A("ff") > 0, A("ffb") > 0
    steps = len(step_ns["full"])
    out(f"\n== {name}: {steps} steps x {LANES} lanes ({len(rows)} states)")
    out("Q1 one-lane full fill (LLMatcher.unsafe_compute_mask_ptr) by allowed-set size; "
        "and the predictors in the same states (us):")
    out(f"   {'class':>7} {'share':>6} {'fill med':>8} {'mean':>6} {'p90':>6} {'of fill time':>12} | "
        f"{'ff_tok med':>10} {'mean':>6} | {'ff_bytes med':>12} {'mean':>5} | {'bytes->tok mean':>15}")
    total = fill.sum()
    for label, lo, hi in CLASSES:
        s = (n >= lo) & (n <= hi)
        if not s.any():
            out(f"   {label:>7} {0:>6.3f}")
            continue
        out(f"   {label:>7} {s.mean():>6.3f} {np.median(fill[s]):>8.2f} {fill[s].mean():>6.2f} "
            f"{np.percentile(fill[s], 90):>6.2f} {fill[s].sum() / total:>12.3f} | {np.median(ff_us[s]):>10.2f} "
            f"{ff_us[s].mean():>6.2f} | {np.median(ffb_us[s]):>12.2f} {ffb_us[s].mean():>5.2f} | "
            f"{gate_us[s].mean():>15.2f}")
    out(f"   {'all':>7} {1:>6.3f} {np.median(fill):>8.2f} {fill.mean():>6.2f} {np.percentile(fill, 90):>6.2f} "
        f"{1:>12.3f} | {np.median(ff_us):>10.2f} {ff_us.mean():>6.2f} | {np.median(ffb_us):>12.2f} "
        f"{ffb_us.mean():>5.2f} | {gate_us.mean():>15.2f}")
    c = checks
    out(f"Q2 compute_ff_tokens non-empty at {c['ff_states']} states: mask == one-hot(ff[0]) at {c['ff_agree']}; "
        f"one-token masks with ff empty: {c['one_no_ff']}; remembered ff[1:] served {c['cached_states']} states, "
        f"row exact at {c['cached_agree']}")
    out(f"   compute_ff_bytes non-empty at {c['ffb_states']} states, of which the mask is one token at "
        f"{c['ffb_one']} ({c['ffb_states'] - c['ffb_one']} not); allowed-set size where ff_bytes non-empty but "
        f"ff_tokens empty: " + (lambda s: (f"median {int(np.median(n[s]))}, min {int(n[s].min())}, max {int(n[s].max())}"
                                          if s.any() else "-"))(ffb_nonempty & ~ff_nonempty))
    out(f"   scheme rows bit-exact vs full fill: {c['scheme_rows_equal']}/{c['scheme_rows']}; counter-examples: {len(counter)}")
    for line in counter[:10]:
        out("   ! " + line)
    hows = A("how")
    howY = A("howY")
    out("Q4 32-lane host cost a step, us (timed; mean / median):")
    full = np.array(step_ns["full"]) / 1e3
    for key, label in (("full", "full fill, all lanes (tfd _fill)"),
                       ("ff", "shortcut: remembered ff | compute_ff_tokens | fill rest"),
                       ("gated", "shortcut: remembered ff | ff_bytes gate -> ff_tokens | fill rest"),
                       ("oracle", "lower bound: forced lanes free, fill rest")):
        v = np.array(step_ns[key]) / 1e3
        out(f"   {label:<66} {v.mean():8.1f} / {np.median(v):7.1f}  ({v.mean() / full.mean():.2f}x)")
    out(f"   lanes a step: remembered {np.mean(hows == 'cached') * LANES:.1f}, compute_ff_tokens forced "
        f"{np.mean(hows == 'ff') * LANES:.1f}, filled {np.mean(np.char.startswith(hows.astype(str), 'fill')) * LANES:.1f}; "
        f"gated: fills with no ff bytes (no ff_tokens call) {np.mean(howY == 'fill(no ff bytes)') * LANES:.1f}")
    # estimate from the one-lane numbers: cached rows 0, ff-called rows ff_us, non-forced rows ff_us + fill
    est = np.where(hows == "cached", 0.0, ff_us + np.where(n == 1, 0.0, fill))
    out(f"   estimate from one-lane numbers (ff_tokens where called + one-lane fill where not forced): "
        f"{est.mean() * LANES:.1f} vs one-lane fill of all {fill.mean() * LANES:.1f}")


def main() -> int:
    lines: list[str] = []

    def out(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    from tfd.demo import TOKENIZER

    text_tok = TOKENIZER.read_text()
    new = 256
    compiled = records_grammar(text_tok, VOCAB, (0,), new)
    tokenizer = compiled.vocabulary.tokenizer
    out(f"llguidance {llguidance.__version__}; demo tokenizer {TOKENIZER.name} (vocab {VOCAB}), eos (0,), tfd's slices; "
        f"host {os.cpu_count()} CPUs; 1 thread; {time.strftime('%Y-%m-%d %H:%M')}")
    out("grammars: tfd.bench.command.records_grammar(..., new=256) and five schemas (each an array, "
        "minItems 40, of closed(schema)) via Vocabulary(...).compile('start: ' + json_rule(schema))")

    results = {}
    for label, rnd in (("trained", False), ("random", True)):
        toks = bench_tokens(label, rnd, new, compiled)
        steps = min(len(t) for t in toks)

        def replay(i, s, allowed, toks=toks):
            t = toks[i][s]
            assert allowed[t], (i, s, t)
            return t

        results[label] = walk(f"records_grammar, bench tokens, demo {label} weights", tokenizer, compiled.text,
                              steps, replay, out)

    vocabulary = compiled.vocabulary
    structural = structural_tokens(tokenizer)
    for k, (name, schema) in enumerate(schemas().items()):
        g = vocabulary.compile(f"start: {json_rule(schema)}\n")
        rng = np.random.default_rng(100 + k)

        def pick(i, s, allowed, rng=rng):
            cand = np.flatnonzero(allowed)
            if rng.random() < 0.35:
                st = cand[structural[cand]]
                if len(st):
                    cand = st
            return int(rng.choice(cand))

        results[name] = walk(f"{name} (random walk, 35% lean to structural tokens)", tokenizer, g.text, 160, pick, out)

    # overall
    out("\n== all walks together")
    allrows = [r for v in results.values() for r in v["rows"]]
    n = np.array([r["n"] for r in allrows])
    fill = np.array([r["fill"] for r in allrows])
    ff_us = np.array([r["ff_us"] for r in allrows])
    for label, lo, hi in CLASSES:
        s = (n >= lo) & (n <= hi)
        out(f"   {label:>7}: {s.mean():.3f} of states, fill med {np.median(fill[s]):.2f} mean {fill[s].mean():.2f} us, "
            f"{fill[s].sum() / fill.sum():.3f} of fill time; ff_tokens med {np.median(ff_us[s]):.2f} mean {ff_us[s].mean():.2f}")
    tot = {k: sum(v["checks"][k] for v in results.values()) for k in results["trained"]["checks"]}
    out(f"   exactness: ff non-empty {tot['ff_states']} states, one-hot(ff[0]) {tot['ff_agree']}; remembered "
        f"{tot['cached_agree']}/{tot['cached_states']}; ff_bytes non-empty {tot['ffb_states']}, one-token {tot['ffb_one']}; "
        f"one-token with ff empty {tot['one_no_ff']}; scheme rows exact {tot['scheme_rows_equal']}/{tot['scheme_rows']}; "
        f"counter-examples {sum(len(v['counter']) for v in results.values())}")
    (HERE / "result.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

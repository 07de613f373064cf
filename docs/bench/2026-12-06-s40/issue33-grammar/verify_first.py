"""Issue 33: verify-first grammar draws vs the full llguidance mask fill, on the demo's JSON bench grammar.

Verify-first: the masked keyed draw is argmax over allowed t of (logit_t/T + g_t); so walking the
top-K of (logit/T + g) over the whole vocabulary in descending order, the first token the grammar
allows IS the masked draw. Only when none of the K is allowed do we need the full mask.

Run: OMP_NUM_THREADS=1 .venv/bin/python .dev/issue33/verify_first.py [--streams 32] [--new 256]
Single-threaded throughout (torch 1 thread, llguidance executor 1 thread).
"""

from __future__ import annotations

import argparse
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
from tfd.bench.workload import Workload, run  # noqa: E402
from tfd.checkpoint import Checkpoint  # noqa: E402
from tfd.demo import TOKENIZER, build_demo  # noqa: E402
from tfd.engine import decode_pipeline, grammar as tfd_grammar, sampling  # noqa: E402
from tfd.families.hybrid import HybridModel, load_model  # noqa: E402

HERE = Path(__file__).resolve().parent
KS = (8, 32, 128, 512)
VOCAB = 4096
WORDS = VOCAB // 32


# ---------------------------------------------------------------- real demo logits (bench workload)

_RECORD: list[tuple[int, int, np.ndarray]] = []  # (seed, position, descending order of scores)
_real_draw = sampling.draw


def _recording_draw(logits, temperature, seeds, positions, offset=0, out=None, out_rows=None, allowed=None):
    """sampling.draw, recording each grammar row's descending order of logit/T + Gumbel (CPU path)."""
    if allowed is not None:
        t = temperature
        if t.dtype == torch.int64:
            t = t.to(torch.int32).view(torch.float32)
        lg = logits.float()
        noise = sampling.gumbel(seeds, positions + offset, lg.shape[-1])
        scores = lg / torch.where(t <= 0, 1.0, t)[:, None] + noise
        order = torch.sort(scores, dim=-1, descending=True, stable=True).indices.to(torch.int16).numpy()
        for r in range(scores.shape[0]):
            _RECORD.append((int(seeds[r]), int(positions[r]) + offset, order[r].copy()))
    return _real_draw(logits, temperature, seeds, positions, offset, out, out_rows, allowed)


def collect(model: HybridModel, compiled, streams: int, prompt: int, new: int):
    """Run the bench's own JSON workload on CPU; per lane the [steps, vocab] score orders and tokens."""
    _RECORD.clear()
    sampling.draw = decode_pipeline.draw = _recording_draw
    try:
        began = time.perf_counter()
        timings = run(model, Workload(streams, prompt, new, grammar=compiled, grammar_name="json"), graphs=False)
        took = time.perf_counter() - began
    finally:
        sampling.draw = decode_pipeline.draw = _real_draw
    by_lane: dict[int, dict[int, np.ndarray]] = {}
    for seed, position, order in _RECORD:
        by_lane.setdefault(seed, {})[position] = order  # a redraw of the same key replaces: same scores
    orders = []
    for lane in range(streams):
        got = by_lane[lane]
        orders.append(np.stack([got[p] for p in sorted(got)]))
    return orders, timings.tokens, took


# ---------------------------------------------------------------- llguidance

def popcount_rows(mask: np.ndarray) -> np.ndarray:
    return np.unpackbits(mask.view(np.uint8), axis=-1).sum(axis=-1)


def allowed_bits(mask_row: np.ndarray) -> np.ndarray:
    """bool [VOCAB] from an int32 [WORDS] row (bit t%32 of word t//32, little-endian)."""
    return np.unpackbits(mask_row.view(np.uint8), bitorder="little").astype(bool)[:VOCAB]


class Lanes:
    """Three independently compiled matchers a lane (own lexer caches): F for tfd's batched executor
    fill, S for a single-lane fill, C for candidate checks; all advanced by the same tokens."""

    def __init__(self, tokenizer, text: str, n: int) -> None:
        make = lambda: [llguidance.LLMatcher(tokenizer, text, log_level=0) for _ in range(n)]  # noqa: E731
        self.F, self.S, self.C, self.T = make(), make(), make(), make()
        self.n = n
        self.executor = llguidance.LLExecutor(num_threads=1)
        self.buf = np.zeros((n, WORDS), dtype=np.int32)
        self.one = np.zeros((1, WORDS), dtype=np.int32)

    def fill_batched(self) -> int:
        """tfd's way (grammar._fill): all lanes through the executor; ns."""
        t0 = time.perf_counter_ns()
        self.executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(self.F)], self.buf.ctypes.data,
                                              WORDS * 4, self.n)
        return time.perf_counter_ns() - t0

    def fill_one(self, i: int) -> int:
        t0 = time.perf_counter_ns()
        self.S[i].unsafe_compute_mask_ptr(self.one.ctypes.data, WORDS * 4)
        return time.perf_counter_ns() - t0

    def take(self, i: int, token: int) -> None:
        for group in (self.F, self.S, self.C, self.T):
            assert group[i].consume_token(token), token


def walk(lanes: Lanes, steps: int, order_of, recorded_tokens=None):
    """Lockstep walk of all lanes; ``order_of(lane, step)`` gives the descending order of the scores
    (logit/T + Gumbel) over the whole vocabulary. Each draw is the first token of the order that the
    full mask allows (ground truth). Returns per-draw records, the 32-lane fill times, and checks."""
    rows = []
    batched_ns = []
    mismatches = 0
    for step in range(steps):
        if any(m.is_stopped() for m in lanes.F):
            break
        batched_ns.append(lanes.fill_batched())
        for i in range(lanes.n):
            fill_ns = lanes.fill_one(i)
            assert np.array_equal(lanes.one[0], lanes.buf[i])
            bits = allowed_bits(lanes.buf[i])
            order = order_of(i, step)
            rank = int(np.argmax(bits[order]))  # the masked draw: the first allowed in descending order
            token = int(order[rank])
            if recorded_tokens is not None and recorded_tokens[i][step] != token:
                mismatches += 1
            # llguidance's forced bytes and tokens, on matcher T
            t1 = time.perf_counter_ns()
            ffb = lanes.T[i].compute_ff_bytes()
            ffb_ns = time.perf_counter_ns() - t1
            t1 = time.perf_counter_ns()
            ff = lanes.T[i].compute_ff_tokens()
            ff_ns = time.perf_counter_ns() - t1
            # verify-first on matcher C: validate_tokens([t]) down the order until one passes (<= 512)
            m = lanes.C[i]
            cand = order[:KS[-1]].tolist()
            marks = {}
            found = -1
            t0 = time.perf_counter_ns()
            for j, t in enumerate(cand):
                if m.validate_tokens([t]):
                    found = j
                    break
                if j + 1 in KS:
                    marks[j + 1] = time.perf_counter_ns() - t0
            end = time.perf_counter_ns() - t0
            # (checks, ns, found-within-K) for each K: a miss spends K checks, then needs the fill
            at_k = {k: ((found + 1, end, True) if 0 <= found < k else (k, marks.get(k, end), False)) for k in KS}
            rows.append(dict(step=step, lane=i, allowed=int(bits.sum()), rank=rank, fill=fill_ns / 1e3,
                             ff=ff, ff_us=ff_ns / 1e3, ffb=bool(ffb), ffb_us=ffb_ns / 1e3, token=token, found=found, at_k=at_k,
                             wrong=found != (rank if rank < KS[-1] else -1)))
            lanes.take(i, token)
    return rows, batched_ns, mismatches


def per_check_costs(tokenizer, text: str, rng: np.random.Generator, walk_tokens, per_state=8):
    """Per-call cost of each API at the states of one real walk (lane 0's tokens), each API on a matcher
    of its own (so no call finds a state another call already explored): mean over the walk, us."""
    apis = ("validate_tokens([t])", "try_consume_tokens([t])+rollback", "compute_ff_bytes", "compute_ff_tokens",
            "compute_mask (1 lane)")
    ms = {api: llguidance.LLMatcher(tokenizer, text, log_level=0) for api in apis}
    out: dict[str, list[float]] = {api: [] for api in apis}
    first: list[float] = []
    buf = np.zeros(WORDS, dtype=np.int32)
    for tok in walk_tokens:
        cands = rng.integers(0, VOCAB, size=per_state).tolist()
        m = ms[apis[0]]
        t0 = time.perf_counter_ns()
        m.validate_tokens([cands[0]])
        t1 = time.perf_counter_ns()
        for t in cands[1:]:
            m.validate_tokens([t])
        t2 = time.perf_counter_ns()
        first.append(t1 - t0)
        out[apis[0]].append((t2 - t0) / len(cands))
        m = ms[apis[1]]
        t0 = time.perf_counter_ns()
        for t in cands:
            if m.try_consume_tokens([t]):
                m.rollback(1)
        out[apis[1]].append((time.perf_counter_ns() - t0) / len(cands))
        t0 = time.perf_counter_ns()
        ms[apis[2]].compute_ff_bytes()
        out[apis[2]].append(time.perf_counter_ns() - t0)
        t0 = time.perf_counter_ns()
        ms[apis[3]].compute_ff_tokens()
        out[apis[3]].append(time.perf_counter_ns() - t0)
        t0 = time.perf_counter_ns()
        ms[apis[4]].unsafe_compute_mask_ptr(buf.ctypes.data, WORDS * 4)
        out[apis[4]].append(time.perf_counter_ns() - t0)
        for m in ms.values():
            assert m.consume_token(tok)
    res = {f"{k} (per candidate, {per_state} a state)" if "[t]" in k else k: np.mean(v) / 1e3 for k, v in out.items()}
    res["validate_tokens: first candidate at a state"] = np.mean(first) / 1e3
    return res


def report(name: str, rows, batched_ns, n_lanes: int, out) -> None:
    steps = len(batched_ns)
    A = lambda key: np.array([r[key] for r in rows])  # noqa: E731
    allowed, ranks, fills, ff_us = A("allowed"), A("rank"), A("fill"), A("ff_us")
    forced = np.array([bool(r["ff"]) for r in rows])
    wrong = A("wrong")
    scale = 32 / n_lanes
    out(f"\n== {name}: {steps} steps x {n_lanes} lanes ({len(rows)} draws)")
    out(f"full fill, {n_lanes}-lane executor call (tfd's _fill, 1 thread): mean {np.mean(batched_ns)/1e3:.1f} us/step "
        f"(median {np.median(batched_ns)/1e3:.1f}) = {np.mean(batched_ns)/1e3/n_lanes:.2f} us/lane")
    out(f"full fill, one lane (LLMatcher.unsafe_compute_mask_ptr): mean {fills.mean():.2f} us, median "
        f"{np.median(fills):.2f}, p90 {np.percentile(fills, 90):.2f}")
    qs = np.percentile(allowed, [10, 25, 50, 75, 90])
    out("allowed-set size p10/p25/p50/p75/p90 = " + "/".join(str(int(q)) for q in qs)
        + f"; ==1: {np.mean(allowed == 1):.3f}, 2..16: {np.mean((allowed > 1) & (allowed <= 16)):.3f}, "
          f"17..999: {np.mean((allowed > 16) & (allowed < 1000)):.3f}, >=1000: {np.mean(allowed >= 1000):.3f}")
    out("rank of the draw in the unmasked order p50/p90/p99 = "
        + "/".join(str(int(q)) for q in np.percentile(ranks, [50, 90, 99])) + f"; rank 0 (unmasked draw already allowed): {np.mean(ranks == 0):.3f}")
    for bucket, sel in (("allowed==1", allowed == 1), ("2..16", (allowed > 1) & (allowed <= 16)),
                        ("17..999", (allowed > 16) & (allowed < 1000)), (">=1000", allowed >= 1000)):
        if sel.any():
            out(f"  {bucket:>10}: {sel.mean():.3f} of draws, one-lane fill mean {fills[sel].mean():.2f} us, "
                + ", ".join(f"hit@{k} {np.mean(ranks[sel] < k):.3f}" for k in KS))
    ffdraw = np.array([bool(r["ff"]) and r["ff"][0] == r["token"] for r in rows])
    out(f"compute_ff_tokens: mean {ff_us.mean():.2f} us (median {np.median(ff_us):.2f}); non-empty at {forced.mean():.3f} "
        f"of draws, its first token the draw at {ffdraw[forced].mean() if forced.any() else float('nan'):.3f} of those; "
        f"allowed==1 draws with ff non-empty: {forced[allowed == 1].mean() if (allowed == 1).any() else float('nan'):.3f}")
    out(f"validate_tokens vs mask: wrong first-pass candidate at {wrong.sum()} draws "
        f"({wrong[forced].sum()} in ff states, {wrong[~forced].sum()} in non-ff states)")
    checks = sum(r["at_k"][KS[-1]][0] for r in rows)
    check_us = sum(r["at_k"][KS[-1]][1] for r in rows) / 1e3
    out(f"per-candidate check (validate_tokens in a Python loop): {check_us / checks:.3f} us ({checks} checks)")

    # ff cache: call compute_ff_tokens only when the lane's list of forced tokens is used up
    ff_calls = np.zeros(len(rows), dtype=bool)
    by_lane: dict[int, list] = {}
    cache_wrong = 0
    for idx, r in enumerate(rows):
        left = by_lane.get(r["lane"], [])
        if left:
            cache_wrong += left[0] != r["token"]
            by_lane[r["lane"]] = left[1:]
        else:
            ff_calls[idx] = True
            by_lane[r["lane"]] = list(r["ff"][1:]) if r["ff"] else []
    served_by_cache = ~ff_calls
    out(f"ff cache: compute_ff_tokens called at {ff_calls.mean():.3f} of draws; cached forced tokens wrong: {cache_wrong}")
    full = np.mean(batched_ns) / 1e3 * scale
    out(f"host cost a step for 32 lanes, us (full fill = {full:.1f} by executor, {fills.mean()*32:.1f} by one-lane fills):")
    out(f"{'K':>5} {'hit':>6} {'hit non-ff':>10} {'checks/draw':>11} {'VF only*':>9} {'ff+VF':>7} {'ffcache+VF':>10} {'..of which fills':>16}")
    for k in KS:
        hit = np.array([r["at_k"][k][2] for r in rows])
        n_chk = np.array([r["at_k"][k][0] for r in rows])
        chk = np.array([r["at_k"][k][1] for r in rows]) / 1e3
        vf = chk + np.where(hit, 0.0, fills)
        ffvf = ff_us + np.where(forced, 0.0, vf)
        # cached: forced rows served by the cache cost 0; rows calling ff pay it, then VF if not forced
        cached = np.where(served_by_cache, 0.0, ff_us + np.where(forced, 0.0, vf))
        fills_part = np.where(served_by_cache | forced | hit, 0.0, fills)
        out(f"{k:>5} {hit.mean():>6.3f} {hit[~forced].mean() if (~forced).any() else float('nan'):>10.3f} "
            f"{n_chk.mean():>11.2f} {vf.mean()*32:>9.1f} {ffvf.mean()*32:>7.1f} {cached.mean()*32:>10.1f} "
            f"{fills_part.mean()*32:>16.1f}")
    # gated: compute_ff_bytes (cheap) first; only where bytes are forced, compute_ff_tokens (dear), whose
    # tokens are the next draws (cached); else verify-first down the top K, a miss filling the lane's mask
    ffb, ffb_us = A("ffb"), A("ffb_us")
    left: dict[int, list] = {}
    kinds = np.zeros(len(rows), dtype=np.int8)  # 0 cached, 1 ff-bytes then ff-tokens forced, 2 ff-tokens empty -> VF, 3 VF
    for idx, r in enumerate(rows):
        rest = left.get(r["lane"], [])
        if rest:
            assert rest[0] == r["token"]
            left[r["lane"]] = rest[1:]
            kinds[idx] = 0
        elif r["ffb"] and r["ff"]:
            left[r["lane"]] = list(r["ff"][1:])
            kinds[idx] = 1
        else:
            kinds[idx] = 2 if r["ffb"] else 3
    assert not (wrong & (kinds >= 2)).any()  # exact wherever the scheme trusts validate_tokens
    out(f"gated scheme: draws served from cached forced tokens {np.mean(kinds == 0):.3f}, by compute_ff_tokens "
        f"{np.mean(kinds == 1):.3f}, verify-first after ff bytes but no ff tokens {np.mean(kinds == 2):.3f}, "
        f"verify-first with no forced bytes {np.mean(kinds == 3):.3f}; compute_ff_bytes mean {ffb_us.mean():.2f} us")
    out(f"{'K':>5} {'VF hit':>7} {'gated us/step':>13} {'= ff_bytes':>10} {'+ ff_tokens':>11} {'+ checks':>8} {'+ miss fills':>12} {'misses/step':>11}  (32 lanes; full fill {full:.1f})")
    for k in KS:
        hit = np.array([r["at_k"][k][2] for r in rows])
        chk = np.array([r["at_k"][k][1] for r in rows]) / 1e3
        vf_rows = kinds >= 2
        p_ffb = np.where(kinds >= 1, ffb_us, 0.0)
        p_fft = np.where((kinds == 1) | (kinds == 2), ff_us, 0.0)
        p_chk = np.where(vf_rows, chk, 0.0)
        p_fill = np.where(vf_rows & ~hit, fills, 0.0)
        tot = p_ffb + p_fft + p_chk + p_fill
        out(f"{k:>5} {hit[vf_rows].mean():>7.3f} {tot.mean()*32:>13.1f} {p_ffb.mean()*32:>10.1f} {p_fft.mean()*32:>11.1f} "
            f"{p_chk.mean()*32:>8.1f} {p_fill.mean()*32:>12.1f} {np.mean(vf_rows & ~hit)*32:>11.2f}")
    out("  (* VF only: validate_tokens alone, NOT exact: it accepts non-canonical tokens the mask bars in forced states)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--synthetic-steps", type=int, default=256)
    args = ap.parse_args()
    lines: list[str] = []

    def out(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    text_tok = TOKENIZER.read_text()
    path = build_demo("qwen3_5", HERE / "cache")
    checkpoint = Checkpoint.open(path)
    trained = load_model(checkpoint, "cpu", torch.float32, progress=False)
    eos = trained.cfg.eos or (0,)
    compiled = records_grammar(text_tok, trained.cfg.vocab, eos, args.new)
    tokenizer = compiled.vocabulary.tokenizer
    gtext = compiled.text
    out(f"llguidance {llguidance.__version__}; demo vocab {trained.cfg.vocab} (tokenizer {TOKENIZER.name}), "
        f"eos {eos}; grammar = tfd.bench.command.records_grammar(demo tokenizer, {trained.cfg.vocab}, eos, "
        f"new={args.new}) [RECORD schema array minItems={args.new}], tfd's slices; threads: 1")
    out(f"host: {os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M')}")

    rng = np.random.default_rng(0)
    sources = {}
    for label, model in (("demo trained weights", trained),
                         ("demo random weights (--random-weights)",
                          HybridModel.random(checkpoint.family, checkpoint.text_config, dtype=torch.float32,
                                             device="cpu", head=False))):
        orders, tokens, took = collect(model, compiled, args.streams, args.prompt, args.new)
        out(f"[{label}: bench workload {args.streams}x{args.prompt}-{args.new} json on CPU in {took:.1f}s; "
            f"sample lane-0 text: {tokenizer.decode_str(list(tokens[0][:60]))!r}]")
        sources[label] = (orders, tokens)

    # per-candidate API costs along lane 0 of the trained run
    costs = per_check_costs(tokenizer, gtext, rng, list(sources["demo trained weights"][1][0]))
    out("\nper-call costs, mean over the states of one real walk (trained lane 0), us: "
        + "; ".join(f"{k} {v:.2f}" for k, v in costs.items()))

    for label, (orders, tokens) in sources.items():
        lanes = Lanes(tokenizer, gtext, args.streams)
        steps = min(len(o) for o in orders)
        rows, batched, mism = walk(lanes, steps, lambda i, s: orders[i][s].astype(np.int64), tokens)
        report(label, rows, batched, args.streams, out)
        out(f"  (replayed draws differing from the engine's own tokens: {mism})")

    # synthetic scores
    n = args.streams
    uni_rng = np.random.default_rng(1)
    lanes = Lanes(tokenizer, gtext, n)
    rows, batched, _ = walk(lanes, args.synthetic_steps, lambda i, s: uni_rng.permutation(VOCAB))
    report("synthetic uniform scores (random order each step)", rows, batched, n, out)
    zrng = np.random.default_rng(2)
    popularity = [zrng.permutation(VOCAB) for _ in range(n)]  # a fixed token-popularity rank a lane
    zipf = [-np.log1p(p.astype(np.float64)) for p in popularity]  # logit = -log(rank+1): p ~ 1/rank

    def zipf_order(i: int, s: int) -> np.ndarray:
        g = -np.log(-np.log(zrng.random(VOCAB)))
        return np.argsort(-(zipf[i] + g), kind="stable")

    lanes = Lanes(tokenizer, gtext, n)
    rows, batched, _ = walk(lanes, args.synthetic_steps, zipf_order)
    report("synthetic Zipf(1) logits + Gumbel, fixed popularity per lane", rows, batched, n, out)
    (HERE / "result.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())

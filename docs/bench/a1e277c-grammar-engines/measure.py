"""Benchmark xgrammar vs llguidance for tfd (CPU only, 2 cores).

Usage: /tmp/gram/bin/python /tmp/gram/measure.py [--steps N] [--tok name=path ...]
Everything here is transformers-free on our side (xgrammar itself imports transformers).
"""
import argparse, os, json, math, random, statistics, sys, time, gc
import importlib.metadata as md

import torch
from tokenizers import Tokenizer

T0 = time.perf_counter()
import llguidance as llg
T_LLG_IMPORT = time.perf_counter() - T0
T0 = time.perf_counter()
import xgrammar as xgr
T_XGR_IMPORT = time.perf_counter() - T0
import llguidance.numpy as llg_np  # noqa
import llguidance.torch as llg_torch  # noqa  (defines a torch.compile'd kernel lazily)

NLANES = 32
ns = time.perf_counter_ns


def ms(x_ns):
    return x_ns / 1e6


def stats(vals_ns):
    v = sorted(vals_ns)
    n = len(v)
    mean = sum(v) / n
    p50 = v[n // 2]
    p99 = v[min(n - 1, int(math.ceil(0.99 * n)) - 1)]
    return mean / 1e3, p50 / 1e3, p99 / 1e3, v[-1] / 1e3  # microseconds


def fmt_stats(name, vals_ns):
    m, p50, p99, mx = stats(vals_ns)
    return f"{name:<48s} mean {m:9.1f} us  p50 {p50:9.1f}  p99 {p99:9.1f}  max {mx:9.1f}  (n={len(vals_ns)})"


# ---------------------------------------------------------------- schemas
SCHEMA_TYPICAL = {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "max_results": {"type": "integer"},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "mode": {"type": "string", "enum": ["fast", "balanced", "thorough", "exhaustive"]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["query", "max_results", "mode"],
    "additionalProperties": False,
}
SCHEMA_NESTED = {
    "type": "object",
    "properties": {
        "orders": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "item": {"type": "string"},
                    "qty": {"type": "number"},
                    "shipping": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string"},
                            "zip": {"type": "string"},
                            "express": {"type": "boolean"},
                        },
                        "required": ["city", "zip", "express"],
                        "additionalProperties": False,
                    },
                },
                "required": ["id", "item", "qty", "shipping"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["orders"],
    "additionalProperties": False,
}
SCHEMA_ANY_OBJECT = {"type": "object"}  # OpenAI response_format=json_object

WORDS = ("weather forecast paris london tokyo restaurant cheap italian near station open late "
         "python error traceback install package version kernel memory cache latency the a of "
         "for with and best how to fix slow query database index").split()


def make_instance(rng):
    d = {"query": " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14))),
         "max_results": rng.randint(1, 500)}
    if rng.random() < 0.7:
        d["temperature"] = round(rng.uniform(0, 2), rng.randint(1, 3))
    d["mode"] = rng.choice(["fast", "balanced", "thorough", "exhaustive"])
    if rng.random() < 0.8:
        d["tags"] = [rng.choice(WORDS) for _ in range(rng.randint(0, 5))]
    return json.dumps(d)  # default separators ", " and ": " (what models usually emit)


# ---------------------------------------------------------------- tokenizer helpers
def load_tok(path):
    s = open(path, encoding="utf-8").read()
    hf = Tokenizer.from_str(s)
    return s, hf


def stop_ids(hf):
    ids = [hf.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>")]
    return [i for i in ids if i is not None]


# ---------------------------------------------------------------- engine adapters
class XGR:
    name = "xgrammar"

    def __init__(self, tok_json, hf, threads=2):
        t = ns()
        vocab = hf.get_vocab(with_added_tokens=True)   # {token_str: id}
        V = max(vocab.values()) + 1
        enc = [""] * V
        for k, i in vocab.items():
            enc[i] = k
        # metadata detection straight from the tokenizer.json (no transformers object)
        meta = xgr.TokenizerInfo._detect_metadata_from_hf(tok_json)
        self.info = xgr.TokenizerInfo(enc, meta["vocab_type"], vocab_size=V,
                                      stop_token_ids=stop_ids(hf),
                                      add_prefix_space=meta["add_prefix_space"])
        self.t_tokinfo = ns() - t
        self.meta = meta
        self.V = V
        self.threads = threads
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=threads)
        self.eos = stop_ids(hf)[0]

    def new_compiler(self, **kw):
        return xgr.GrammarCompiler(self.info, max_threads=self.threads, **kw)

    def compile_schema(self, schema, compiler=None):
        c = compiler or self.compiler
        if schema is None:
            return c.compile_builtin_json_grammar()
        return c.compile_json_schema(json.dumps(schema))

    def matcher(self, cg):
        return xgr.GrammarMatcher(cg)

    def fill(self, m, bm, i):
        m.fill_next_token_bitmask(bm, i)

    def accept(self, m, t):
        return m.accept_token(t)

    def reset(self, m):
        m.reset()

    def make_batch(self, nthreads):
        return xgr.BatchGrammarMatcher(max_threads=nthreads)

    def batch_fill(self, b, ms_, bm):
        b.batch_fill_next_token_bitmask(ms_, bm)

    def batch_accept(self, b, ms_, toks):
        return xgr.BatchGrammarMatcher.batch_accept_token(ms_, toks)


class LLG:
    name = "llguidance"

    def __init__(self, tok_json, hf, threads=2):
        t = ns()
        self.tok = llg.LLTokenizer(tok_json, eos_token=stop_ids(hf))
        self.t_tokinfo = ns() - t
        self.V = self.tok.vocab_size
        self.eos = stop_ids(hf)[0]

    def grammar(self, schema):
        return llg.LLMatcher.grammar_from_json_schema(schema)

    def compile_schema(self, schema, compiler=None):
        # "compile" = grammar text + matcher construction (llguidance has no separate
        # compiled-grammar object; the lexer/parser is built in the LLMatcher ctor)
        g = llg.LLMatcher.grammar_from_json_schema(schema)
        m = llg.LLMatcher(self.tok, g)
        assert not m.is_error(), m.get_error()
        return m

    def matcher(self, proto):  # proto is an LLMatcher; a fresh one is a deep copy
        return proto.deep_copy()

    def fill(self, m, bm, i):
        row = bm[i]
        m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)

    def accept(self, m, t):
        return m.consume_token(t)

    def reset(self, m):
        m.reset()

    def make_batch(self, nthreads):
        return llg.LLExecutor(num_threads=nthreads)

    def batch_fill(self, ex, ms_, bm):
        llg_torch.fill_next_token_bitmask_par(ex, [(m, i) for i, m in enumerate(ms_)], bm)

    def batch_accept(self, ex, ms_, toks):
        return llg_torch.consume_token_par(ex, list(zip(ms_, toks)))


# ---------------------------------------------------------------- benchmarks
def bench_compile(E, out):
    rows = []
    # warm up the engine on an unrelated tiny schema so "cold" = first time for *this* schema
    E.compile_schema({"type": "object", "properties": {"zz": {"type": "boolean"}}, "required": ["zz"]})
    for label, schema in [("typical", SCHEMA_TYPICAL), ("nested", SCHEMA_NESTED),
                          ("json_object", SCHEMA_ANY_OBJECT)]:
        if isinstance(E, XGR):
            t = ns(); cg = E.compile_schema(schema); cold = ns() - t
            t = ns(); E.compile_schema(schema); cached = ns() - t
            # uncached repeats (fresh compiler, cache disabled)
            reps = []
            for _ in range(3):
                c = E.new_compiler(cache_enabled=False)
                t = ns(); cg2 = E.compile_schema(schema, c); reps.append(ns() - t)
            t = ns(); m = E.matcher(cg); t_m = ns() - t
            bm = xgr.allocate_token_bitmask(1, E.V)
            t = ns(); E.fill(m, bm, 0); first = ns() - t
            extra = ""
            if label == "typical":
                c = E.new_compiler(cache_enabled=False, enable_dynamic_compilation=True)
                t = ns(); cgd = E.compile_schema(schema, c); dyn = ns() - t
                md_ = E.matcher(cgd); t = ns(); E.fill(md_, bm, 0); dynfirst = ns() - t
                extra = f" | dynamic_compilation: compile {ms(dyn):.2f} ms + first mask {ms(dynfirst):.2f} ms"
            rows.append(f"  {label:<12s} cold {ms(cold):9.2f} ms | again(cached) {ms(cached):8.3f} ms | "
                        f"uncached median {ms(sorted(reps)[1]):9.2f} ms | matcher ctor {ms(t_m):.3f} ms | "
                        f"first mask {ms(first):.3f} ms{extra}")
        else:
            t = ns(); g = E.grammar(schema); t_g = ns() - t
            t = ns(); m = llg.LLMatcher(E.tok, g); cold = ns() - t
            assert not m.is_error(), m.get_error()
            bm = llg_torch.allocate_token_bitmask(1, E.V)
            t = ns(); E.fill(m, bm, 0); first = ns() - t
            t = ns(); m2 = llg.LLMatcher(E.tok, g); again = ns() - t
            t = ns(); E.fill(m2, bm, 0); first2 = ns() - t
            t = ns(); m3 = m.deep_copy(); t_copy = ns() - t
            reps = []
            for _ in range(3):
                t = ns(); llg.LLMatcher(E.tok, E.grammar(schema)); reps.append(ns() - t)
            rows.append(f"  {label:<12s} cold {ms(t_g + cold):9.2f} ms (schema->grammar {ms(t_g):.3f}) | "
                        f"again {ms(again):8.3f} ms | median of 3 {ms(sorted(reps)[1]):8.3f} ms | "
                        f"deep_copy {ms(t_copy):.3f} ms | first mask {ms(first):.3f} ms (2nd matcher {ms(first2):.3f})")
    out("  compile (schema -> ready matcher):")
    for r in rows:
        out(r)


def bench_mask(E, hf, steps, out):
    rng = random.Random(1234)
    lanes_tokens = []
    for lane in range(NLANES):
        inst = make_instance(random.Random(lane))
        lanes_tokens.append(hf.encode(inst, add_special_tokens=False).ids + [E.eos])
    avg_len = statistics.mean(len(x) for x in lanes_tokens)
    if isinstance(E, XGR):
        cg = E.compile_schema(SCHEMA_TYPICAL)
        t = ns(); matchers = [E.matcher(cg) for _ in range(NLANES)]; t_ctor = ns() - t
    else:
        g = E.grammar(SCHEMA_TYPICAL)
        t = ns(); matchers = [llg.LLMatcher(E.tok, g) for _ in range(NLANES)]; t_ctor = ns() - t
        proto = matchers[0]
        t = ns(); _ = [proto.deep_copy() for _ in range(NLANES)]; t_copy = ns() - t
        out(f"  32 matchers: 32x LLMatcher() {ms(t_ctor):.2f} ms; 32x deep_copy() {ms(t_copy):.3f} ms")
    if isinstance(E, XGR):
        out(f"  32 matchers: 32x GrammarMatcher(compiled) {ms(t_ctor):.3f} ms")
    out(f"  instance tokens per lane: avg {avg_len:.1f} (incl. EOS); sample: "
        f"{hf.decode(lanes_tokens[0][:-1])[:100]!r}")
    Wn = (E.V + 31) // 32

    def run(mode, nthreads=None):
        for m in matchers:
            E.reset(m)
        pos = [0] * NLANES
        bm = torch.full((NLANES, Wn), -1, dtype=torch.int32)
        step_fill, lane_fill, step_acc = [], [], []
        viol = 0
        done = 0
        b = E.make_batch(nthreads) if mode == "batch" else None
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            if mode == "serial":
                t0 = ns()
                for i, m in enumerate(matchers):
                    t = ns(); E.fill(m, bm, i); lane_fill.append(ns() - t)
                step_fill.append(ns() - t0)
            else:
                t0 = ns(); E.batch_fill(b, matchers, bm); step_fill.append(ns() - t0)
            toks = [lanes_tokens[i][pos[i]] for i in range(NLANES)]
            # sanity (untimed): the next token of the valid instance must be allowed
            for i, tk in enumerate(toks):
                if not ((int(bm[i, tk // 32]) >> (tk % 32)) & 1):
                    viol += 1
            t0 = ns()
            if mode == "serial":
                ok = [E.accept(m, tk) for m, tk in zip(matchers, toks)]
            else:
                ok = E.batch_accept(b, matchers, toks)
            step_acc.append(ns() - t0)
            assert all(ok), ("token rejected", mode, [i for i, o in enumerate(ok) if not o])
            for i in range(NLANES):
                pos[i] += 1
                if pos[i] == len(lanes_tokens[i]):  # consumed EOS: request done, recycle lane
                    E.reset(matchers[i]); pos[i] = 0; done += 1
        cpu_wall = (time.process_time() - c0) / (time.perf_counter() - w0)
        tag = mode if mode == "serial" else f"batch threads={nthreads}"
        out("  " + fmt_stats(f"[{tag}] fill 32 lanes / step", step_fill))
        if lane_fill:
            out("  " + fmt_stats(f"[{tag}] fill 1 lane", lane_fill))
        out("  " + fmt_stats(f"[{tag}] accept 32 lanes / step", step_acc))
        out(f"  [{tag}] mask violations: {viol}, completed requests: {done}, process cpu/wall {cpu_wall:.2f}, "
            f"loadavg {os.getloadavg()[0]:.2f}")

    run("serial")
    run("batch", 1)
    run("batch", 2)
    return matchers


def bench_apply(V, out):
    torch.manual_seed(0)
    Wn = (V + 31) // 32
    bm = torch.randint(-2**31, 2**31 - 1, (NLANES, Wn), dtype=torch.int32)
    logits = torch.randn(NLANES, V, dtype=torch.float32)
    shifts = torch.arange(32, dtype=torch.int32)

    def plain(lg, b):
        bits = ((b.unsqueeze(-1) >> shifts) & 1).to(torch.bool).view(b.shape[0], -1)[:, :lg.shape[1]]
        lg.masked_fill_(~bits, float("-inf"))

    # correctness cross-check
    ref = logits.clone(); plain(ref, bm)
    res = {}
    cands = [("xgrammar apply_token_bitmask_inplace (cpu kernel)",
              lambda lg: xgr.apply_token_bitmask_inplace(lg, bm)),
             ("llguidance.torch apply_token_bitmask_inplace (torch.compile)",
              lambda lg: llg_torch.apply_token_bitmask_inplace(lg, bm)),
             ("llguidance.numpy apply_token_bitmask_inplace",
              lambda lg: llg_np.apply_token_bitmask_inplace(lg.numpy(), bm.numpy())),
             ("plain torch unpack->bool->masked_fill_", lambda lg: plain(lg, bm))]
    for name, fn in cands:
        try:
            lg = logits.clone()
            t = ns(); fn(lg); first = ns() - t
            same = torch.equal(torch.isinf(lg), torch.isinf(ref))
            times = []
            for _ in range(100):
                lg = logits.clone()
                t = ns(); fn(lg); times.append(ns() - t)
            out("  " + fmt_stats(name, times) + f"  first call {ms(first):.1f} ms, matches ref: {same}")
        except Exception as e:
            out(f"  {name}: FAILED {type(e).__name__}: {str(e)[:200]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--tok", action="append", default=None)
    ap.add_argument("--engines", default="xgrammar,llguidance")
    a = ap.parse_args()
    toks = a.tok or ["demo4k=/work/main/tfd/assets/demo_tokenizer.json",
                     "big150k=/tmp/gram/big_tokenizer.json",
                     "big248k=/tmp/gram/big248_tokenizer.json"]
    out = lambda s: print(s, flush=True)
    out(f"python {sys.version.split()[0]}  torch {torch.__version__}  torch threads {torch.get_num_threads()}")
    out(f"xgrammar {md.version('xgrammar')}  llguidance {md.version('llguidance')}  tokenizers {md.version('tokenizers')}")
    out(f"import time: llguidance {T_LLG_IMPORT*1e3:.0f} ms, xgrammar {T_XGR_IMPORT*1e3:.0f} ms "
        f"(xgrammar imports torch+transformers; measured after llguidance which imports nothing)")
    for spec in toks:
        label, path = spec.split("=", 1)
        tok_json, hf = load_tok(path)
        out(f"\n=============== tokenizer {label}: {path}  vocab {hf.get_vocab_size(True)}")
        for ename in a.engines.split(","):
            gc.collect()
            E = XGR(tok_json, hf) if ename == "xgrammar" else LLG(tok_json, hf)
            out(f"--- {E.name}: tokenizer info build {ms(E.t_tokinfo):.1f} ms (vocab {E.V})"
                + (f" meta={ {k: str(v) for k, v in E.meta.items()} }" if ename == "xgrammar" else ""))
            bench_compile(E, out)
            bench_mask(E, hf, a.steps, out)
        out(f"--- apply bitmask to [32, {hf.get_vocab_size(True)}] float32 logits (CPU)")
        bench_apply(hf.get_vocab_size(True), out)


if __name__ == "__main__":
    main()

"""Extra checks: GIL release during mask fill (2 Python threads x 16 lanes), and bitmask-apply variants."""
import json, random, time, sys
from concurrent.futures import ThreadPoolExecutor
import torch
from tokenizers import Tokenizer
import llguidance as llg, llguidance.torch as llg_torch
import xgrammar as xgr
sys.path.insert(0, "/tmp/gram")
import measure as M

ns = time.perf_counter_ns
out = lambda s: print(s, flush=True)


def gil_test(path, steps=120):
    tok_json, hf = M.load_tok(path)
    for E in (M.XGR(tok_json, hf), M.LLG(tok_json, hf)):
        lanes = [hf.encode(M.make_instance(random.Random(l)), add_special_tokens=False).ids + [E.eos] for l in range(32)]
        if isinstance(E, M.XGR):
            cg = E.compile_schema(M.SCHEMA_TYPICAL); ms_ = [E.matcher(cg) for _ in range(32)]
        else:
            g = E.grammar(M.SCHEMA_TYPICAL); ms_ = [llg.LLMatcher(E.tok, g) for _ in range(32)]
        bm = torch.full((32, (E.V + 31) // 32), -1, dtype=torch.int32)
        pool = ThreadPoolExecutor(2)

        def half(r):
            for i in r:
                E.fill(ms_[i], bm, i)
        res = {}
        for mode in ("1 thread", "2 py threads"):
            for m in ms_:
                E.reset(m)
            pos = [0] * 32
            tt = []
            for _ in range(steps):
                t = ns()
                if mode == "1 thread":
                    half(range(32))
                else:
                    list(pool.map(half, [range(0, 32, 2), range(1, 32, 2)]))
                tt.append(ns() - t)
                for i in range(32):
                    assert E.accept(ms_[i], lanes[i][pos[i]])
                    pos[i] += 1
                    if pos[i] == len(lanes[i]):
                        E.reset(ms_[i]); pos[i] = 0
            res[mode] = sum(tt) / len(tt) / 1e3
        out(f"  {E.name:<10s} fill 32 lanes/step: 1 thread {res['1 thread']:.0f} us, 2 Python threads {res['2 py threads']:.0f} us "
            f"-> speedup {res['1 thread']/res['2 py threads']:.2f}x (>1 means GIL released)")


def apply_variants(V, only=None):
    torch.manual_seed(0)
    Wn = (V + 31) // 32
    bm = torch.randint(-2**31, 2**31 - 1, (32, Wn), dtype=torch.int32)
    logits = torch.randn(32, V)
    lut = ((torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1).to(torch.bool)  # [256, 8]
    shifts = torch.arange(32, dtype=torch.int32)

    def plain(lg, b):
        bits = ((b.unsqueeze(-1) >> shifts) & 1).to(torch.bool).view(b.shape[0], -1)[:, :lg.shape[1]]
        lg.masked_fill_(~bits, float("-inf"))

    def lut_fn(lg, b):  # little-endian: byte j of word w holds tokens 32w+8j .. 32w+8j+7
        bits = lut[b.view(torch.uint8).to(torch.int64)].view(b.shape[0], -1)[:, :lg.shape[1]]
        lg.masked_fill_(~bits, float("-inf"))

    @torch.compile(dynamic=False)
    def compiled_plain(lg, b):
        bits = ((b.unsqueeze(-1) >> shifts) & 1).to(torch.bool).view(b.shape[0], -1)[:, :lg.shape[1]]
        lg.masked_fill_(~bits, float("-inf"))

    ref = logits.clone(); plain(ref, bm)
    cands = [("plain torch shift-unpack", lambda lg: plain(lg, bm)),
             ("plain torch byte-LUT unpack", lambda lg: lut_fn(lg, bm)),
             ("our own torch.compile(shift-unpack)", lambda lg: compiled_plain(lg, bm)),
             ("xgrammar backend=cpu (C++)", lambda lg: xgr.apply_token_bitmask_inplace(lg, bm, backend="cpu")),
             ("xgrammar backend=torch_compile", lambda lg: xgr.apply_token_bitmask_inplace(lg, bm, backend="torch_compile")),
             ("xgrammar backend=torch_native", lambda lg: xgr.apply_token_bitmask_inplace(lg, bm, backend="torch_native")),
             ("llguidance.torch (torch.compile)", lambda lg: llg_torch.apply_token_bitmask_inplace(lg, bm))]
    for name, fn in cands:
        if only is not None and name != cands[only][0]:
            continue
        try:
            lg = logits.clone(); t = ns(); fn(lg); first = ns() - t
            ok = torch.equal(torch.isinf(lg), torch.isinf(ref))
            tt = []
            for _ in range(60):
                lg = logits.clone(); t = ns(); fn(lg); tt.append(ns() - t)
            out("  " + M.fmt_stats(name, tt) + f"  first {first/1e6:.0f} ms ok={ok}")
        except Exception as e:
            out(f"  {name}: FAILED {type(e).__name__}: {str(e)[:160]}")


if __name__ == "__main__" and len(sys.argv) > 2:  # isolated: extra.py V idx
    apply_variants(int(sys.argv[1]), int(sys.argv[2])); sys.exit(0)
if __name__ == "__main__":
    out("== GIL: does a mask fill release the GIL? (big150k, typical schema)")
    gil_test("/tmp/gram/big_tokenizer.json")
    for V in (150004, 248004):
        out(f"== apply bitmask variants, [32, {V}] float32, CPU, torch threads {torch.get_num_threads()}")
        apply_variants(V)

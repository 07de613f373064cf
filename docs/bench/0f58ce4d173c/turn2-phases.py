"""Turn two from the page cache, six fresh runners in a row, its phases timed (synchronised)."""
import shutil, sys, tempfile, time, collections
from pathlib import Path
import torch
import tfd.engine.runner as R
import tfd.store.learned as L
import tfd.store.store as S
import tfd.engine.resume as RS
from tfd.bench.main import random_model
from tfd.bench import conversation as conv
from tfd.bench.workload import drive
from tfd.engine.request import Request, Sampling

T = collections.defaultdict(list)
def timed(owner, name, label):
    orig = getattr(owner, name)
    def wrapper(*a, **k):
        torch.cuda.synchronize(); t = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            torch.cuda.synchronize(); T[label].append((time.perf_counter() - t) * 1e3)
    setattr(owner, name, wrapper)
timed(R.Runner, "run", "step")
timed(R.Runner, "admit", "admit")
timed(R.Runner, "open", "open")
timed(L.Learned, "restore", "restore")
timed(S.Store, "read", "store.read")
timed(RS.KeptStates, "keep", "kept.keep") if hasattr(RS, "KeptStates") else None
timed(L.Learned, "find", "learned.find")

model, shape = random_model("qwen3_5-9b", torch.device("cuda"))
conv.turns(model, 1024, 16, True, 8192, 1, 256)
P = 30000
g = torch.Generator().manual_seed(0)
ids = torch.randint(0, model.cfg.vocab, (P,), generator=g)
first = Request("t1", tuple(ids.tolist()), 16, Sampling(temperature=0.0))
window = P + 32 + 64
root = Path(tempfile.mkdtemp(prefix="tfd-c-"))
w = conv.learning(model, window, True, root, 256)
reply = drive(model, [first], 8192, True, runner=w).tokens[0]
w.learned.close(); del w
follow = tuple(torch.randint(0, model.cfg.vocab, (64,), generator=g).tolist())
for threads, gain in ((16, 256), (32, 256), (16, 256)):
    L.READ_THREADS = threads
    second = Request("t2", first.prompt + reply + follow, 1, Sampling(temperature=0.0))
    for attempt in range(3):
        T.clear()
        r = conv.learning(model, window, True, root, gain)
        torch.cuda.synchronize()
        got = drive(model, [second], 8192, True, runner=r)
        r.learned.close()
        print(f"threads {threads} gain {gain} attempt {attempt}: ttft {got.first_token_s[0]*1e3:.1f} ms cached {got.cached[0]} "
              + " ".join(f"{k}={'+'.join(f'{v:.1f}' for v in vs)}" for k, vs in T.items()))
        del r
shutil.rmtree(root)

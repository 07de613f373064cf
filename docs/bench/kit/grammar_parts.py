"""Times the parts of a grammar step at 32 lanes on the device: mask fill, copy, apply, the draw."""
import statistics, sys, time, json
import torch
from tfd.shapes import covering_tokenizer
from tfd.bench.command import records_grammar
from tfd.engine.grammar_masks import allowed, apply
from tfd.engine.sampling import Rows, sample
from tfd.engine.request import Sampling
from tfd.model.memory import to_device

vocab = int(sys.argv[1]) if len(sys.argv) > 1 else 248320
dev = torch.device("cuda")
g = records_grammar(covering_tokenizer(vocab), vocab, (0,), 256)
tok = g.vocabulary.tokenizer
prefix = '[{"name": "Ann Lee", "city": "Oslo", "age": 41, "status": "idle", "tags": ["a", "bc"]}, {"name": "Bo'
ids = tok.tokenize_str(prefix)
ms = []
for lane in range(32):
    m = g.matcher()
    m.inner.consume_tokens(ids[: 5 + lane])  # lanes at different places: keys, strings, numbers
    ms.append(m)
follows = [(m, i, ()) for i, m in enumerate(ms)]
def timed(fn, n=50, sync=False):
    out = []
    for _ in range(n):
        if sync: torch.cuda.synchronize()
        t = time.perf_counter(); fn()
        if sync: torch.cuda.synchronize()
        out.append((time.perf_counter() - t) * 1e6)
    return round(statistics.median(out), 1), round(max(out), 1)
res = {}
res["fill_32_us"] = timed(lambda: allowed(32, follows))
res["fill_1_us"] = timed(lambda: allowed(1, follows[:1]))
mask = allowed(32, follows)
res["to_device_us"] = timed(lambda: to_device(mask, dev), sync=True)
dmask = to_device(mask, dev)
logits = torch.randn(32, vocab, device=dev, dtype=torch.bfloat16)
res["float_copy_us"] = timed(lambda: logits.float(), sync=True)
lf = logits.float()
res["apply_us"] = timed(lambda: apply(lf, dmask), sync=True)
settings = [Sampling(temperature=1.0, seed=i) for i in range(32)]
res["rows_of_us"] = timed(lambda: Rows.of(settings, list(range(32)), [100] * 32, dev, None, mask), sync=True)
rows = Rows.of(settings, list(range(32)), [100] * 32, dev, None, mask)
res["sample_us"] = timed(lambda: sample(lf, rows).tolist(), sync=True)
plain = Rows.of(settings, list(range(32)), [100] * 32, dev)
res["sample_plain_us"] = timed(lambda: sample(lf, plain).tolist(), sync=True)
res["take_32_us"] = timed(lambda: [m.inner.consume_token(ids[5 + i]) and m.inner.rollback(1) for i, m in enumerate(ms)])
print(json.dumps({"vocab": vocab, **res}))

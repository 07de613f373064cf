import glob, os, time, sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, AddedToken
files = []
for root in ["/tmp/gram/lib"] + glob.glob("/usr/lib/python3*"):
    for dp, dn, fn in os.walk(root):
        for f in fn:
            if f.endswith((".py", ".txt", ".md", ".pyi", ".rst")):
                p = os.path.join(dp, f)
                if os.path.isfile(p) and not os.path.islink(p):
                    files.append(p)
print("files", len(files), "MB", sum(os.path.getsize(f) for f in files) / 1e6, flush=True)
def it():
    for p in files:
        try:
            with open(p, "r", encoding="utf-8", errors="ignore") as fh:
                yield fh.read()
        except Exception:
            pass
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
target = int(sys.argv[1]) if len(sys.argv) > 1 else 150000
tr = trainers.BpeTrainer(vocab_size=target, min_frequency=2, special_tokens=special,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
t = time.time()
tok.train_from_iterator(it(), trainer=tr, length=len(files))
print("train s", time.time() - t, flush=True)
tok.add_tokens([AddedToken(x, special=False, normalized=False) for x in ["<think>", "</think>", "<tool_call>", "</tool_call>"]])
print("vocab_size with added", tok.get_vocab_size(with_added_tokens=True))
tok.save(sys.argv[2] if len(sys.argv) > 2 else "/tmp/gram/big_tokenizer.json")

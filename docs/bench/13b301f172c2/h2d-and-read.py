"""H2D bandwidth and read-back variants over the page cache (a 30k-token-like image)."""
import os, tempfile, time, shutil, subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import torch
from tfd.store.store import Image, Store
from tfd.store.copies import host_bytes
from tfd.store.checksum import file_sums, _row_halves, _cached_keys
for cmd in ("lscpu | grep -i -E 'numa|model name|socket'", "nvidia-smi topo -m", "cat /proc/meminfo | head -3"):
    print(subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout)
dev = torch.device("cuda")
N = 992 << 20
host = torch.empty(N, dtype=torch.uint8, pin_memory=True); host.fill_(1)
d = torch.empty(N, dtype=torch.uint8, device=dev)
streams = [torch.cuda.Stream() for _ in range(4)]
def bw(name, fn, n=5):
    best = 1e9
    for _ in range(n):
        torch.cuda.synchronize(); t = time.perf_counter(); fn(); torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    print(f"{name}: {best*1e3:.2f} ms {N/best/1e9:.1f} GB/s", flush=True)
bw("h2d one copy", lambda: d.copy_(host, non_blocking=True))
for size in (2 << 20, 8 << 20, 32 << 20):  # the log's first call (N 985 MiB); its second, the reads, skipped these
    for ns in (1, 2, 4):
        def f(size=size, ns=ns):
            for i, at in enumerate(range(0, N, size)):
                with torch.cuda.stream(streams[i % ns]):
                    d[at:at + size].copy_(host[at:at + size], non_blocking=True)
            for s in streams[:ns]: s.synchronize()
        bw(f"h2d {size>>20} MiB x{ns} streams", f)
bw("d2d copy", lambda: d[: N // 2].copy_(d[N // 2:]))

root = Path(tempfile.mkdtemp(prefix="tfd-rb-"))
store = Store(root, "x", 1 << 50, 1 << 50, 0)
B = 8 << 20
blocks = tuple((f"b{i:03d}", B) for i in range(118))
image = Image("k", 30000, False, (("p", 48 << 20),), blocks)
data = os.urandom(B)
store.write(image, lambda w: w.write(os.urandom(48 << 20)), lambda i, w: w.write(data))
hostr = host[:image.bytes]
devr = d[:image.bytes]
sizes = [b for _, b in blocks] + [48 << 20]
cs, ss = streams[0], streams[1]
state = {}
def copy1(at, size):
    with torch.cuda.stream(cs):
        devr[at:at + size].copy_(hostr[at:at + size], non_blocking=True)
def copy2(at, size):
    s = streams[(at // B) % 2]
    with torch.cuda.stream(s):
        devr[at:at + size].copy_(hostr[at:at + size], non_blocking=True)
def check_end(expected):
    cs.synchronize(); streams[1].synchronize()
    found = file_sums(devr, sizes)
    return [i for i, (a, b) in enumerate(zip(found, expected)) if a != b]
def copy_sum(at, size, two=False):
    s = streams[(at // B) % 2] if two else cs
    with torch.cuda.stream(s):
        devr[at:at + size].copy_(hostr[at:at + size], non_blocking=True)
        e = torch.cuda.Event(); e.record(s)
    ss2 = streams[2]
    ss2.wait_event(e)
    with torch.cuda.stream(ss2):
        if size == B:
            state.setdefault("p", []).append(_row_halves(devr[at:at + size].view(torch.int32)[None], _cached_keys(size // 4, dev)))
        else:
            state.setdefault("p", []).append(None)
def check_landed(expected):
    streams[2].synchronize()
    parts = state.pop("p")
    hs = torch.cat([h for p in parts if p for h in p[:1]]).tolist()
    return []
for threads in (16, 32):
    readers = ThreadPoolExecutor(threads)
    for name, each, chk in (("read only, host check", None, None),
                            ("read only, no check", None, lambda e: []),
                            ("copies, no check", copy1, lambda e: (cs.synchronize(), [])[1]),
                            ("copies 2 streams, no check", copy2, lambda e: (cs.synchronize(), streams[1].synchronize(), [])[2]),
                            ("copies, end sums", copy1, check_end),
                            ("copies, sums as landed", copy_sum, check_landed),
                            ("copies 2 streams, sums as landed", lambda a, s: copy_sum(a, s, True), check_landed)):
        best, all_ = 1e9, []
        for _ in range(4):
            torch.cuda.synchronize(); t = time.perf_counter()
            store.read(image, host_bytes(hostr), readers, each, chk)
            torch.cuda.synchronize()
            all_.append((time.perf_counter() - t) * 1e3)
        print(f"threads {threads} {name}: " + " ".join(f"{x:.1f}" for x in all_) + f" ms; best {image.bytes / min(all_) / 1e6:.1f} GB/s", flush=True)
    readers.shutdown()
torch.cuda.synchronize(); t = time.perf_counter(); file_sums(devr, sizes); print(f"device sums alone {(time.perf_counter()-t)*1e3:.1f} ms")
shutil.rmtree(root)

"""DMA straight from the page cache: mmap a file, cudaHostRegister it read-only, copy to the device."""
import os, tempfile, time, shutil, ctypes, mmap as M
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import torch
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
rt = torch.cuda.cudart()
dev = torch.device("cuda")
torch.cuda.init()
root = Path(tempfile.mkdtemp(prefix="tfd-rg-"))
B, NF = 8 << 20, 118
data = os.urandom(B)
paths = []
for i in range(NF):
    p = root / f"b{i:03d}"
    with open(p, "wb") as f:
        f.write(b"x" * 100 + data); f.flush(); os.fsync(f.fileno())
    paths.append(p)
out = torch.empty(NF * B, dtype=torch.uint8, device=dev)
stream = torch.cuda.Stream()
POP = 0x8000
def mapit(p, flags):
    fd = os.open(p, os.O_RDONLY)
    n = os.fstat(fd).st_size
    a = libc.mmap(None, n, 1, 1 | flags, fd, 0)
    os.close(fd)
    assert a not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
    return a, n
def reg(a, n, flag):
    e = rt.cudaHostRegister(a, n, flag)
    return e
print("ReadOnly supported:", torch.cuda.get_device_properties(0))
for flags_name, mflags, rflag in (("populate+readonly", POP, 8), ("nopopulate+readonly", 0, 8)):
    for threads in (1, 8, 16):
        for rep in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            maps = [None] * NF
            def prep(i):
                a, n = mapit(paths[i], mflags)
                t = time.perf_counter()
                e = reg(a, n, rflag)
                return a, n, e, time.perf_counter() - t
            pool = ThreadPoolExecutor(threads)
            futs = [pool.submit(prep, i) for i in range(NF)]
            regt = 0
            errs = set()
            for i, f in enumerate(futs):
                a, n, e, dt = f.result(); regt += dt; errs.add(int(e) if not hasattr(e, 'value') else e.value)
                maps[i] = (a, n)
                src = torch.frombuffer((ctypes.c_char * B).from_address(a + 100), dtype=torch.uint8)
                with torch.cuda.stream(stream):
                    out[i * B:(i + 1) * B].copy_(src, non_blocking=True)
            t1 = time.perf_counter()
            stream.synchronize()
            t2 = time.perf_counter()
            for a, n in maps:
                rt.cudaHostUnregister(a); libc.munmap(a, n)
            t3 = time.perf_counter()
            pool.shutdown()
            ok = bool((out[:B].cpu() == torch.frombuffer(bytearray(data), dtype=torch.uint8)).all())
            print(f"{flags_name} threads {threads}: queued {1e3*(t1-t0):.1f} ms, landed {1e3*(t2-t0):.1f} ms "
                  f"({NF*B/(t2-t0)/1e9:.1f} GB/s), unregister {1e3*(t3-t2):.1f} ms, register sum {1e3*regt:.1f} ms, errs {errs}, ok {ok}", flush=True)
# one big file
big = root / "big"
with open(big, "wb") as f:
    for i in range(NF): f.write(data)
    f.flush(); os.fsync(f.fileno())
for rep in range(3):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    a, n = mapit(big, 0)
    e = reg(a, n, 8); t1 = time.perf_counter()
    src = torch.frombuffer((ctypes.c_char * n).from_address(a), dtype=torch.uint8)
    with torch.cuda.stream(stream):
        out[:n].copy_(src, non_blocking=True)
    stream.synchronize(); t2 = time.perf_counter()
    rt.cudaHostUnregister(a); libc.munmap(a, n); t3 = time.perf_counter()
    print(f"one file: register {1e3*(t1-t0):.1f} ms copy {1e3*(t2-t1):.1f} unregister {1e3*(t3-t2):.1f} err {e}", flush=True)
shutil.rmtree(root)

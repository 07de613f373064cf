"""Issue 36: is the identity probe's kept state the same bits whatever the pool's pages held before? On
the device (the daemon's starts disagreed on it: docs/bench.md, 2026-12-05): the demo (or TF_SHAPE's
shape) with drafts and graphs as the daemon runs it, the probe prompt run on a pool zeroed, then filled
with random bytes (seeds 1, 2), then zeroed again; each part's digest (pieces by name, rows by part and
page) compared with the first run's, and the parts that differ named. Then the same after the caching
allocator's free memory is filled with random bytes (scratch a kernel might read unwritten), and after
other requests ran on the same runner first (as the daemon's warm-up runs before its probe).
``python .dev/probe_gpu.py``."""
import hashlib
import os

import torch

from tfd.bench.workload import drive
from tfd.cache.image_bytes import state_pages
from tfd.cache.prefixes import Prefixes
from tfd.engine.local_runner import runner_for
from tfd.engine.request import Request, Sampling
from tfd.engine.rounds import drafts_from_head
from tfd.engine.runner import Drafting
from tfd.env import Table
from tfd.models import load
from tfd.store.identity import probe_prompt

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
settings = Table.load().read(os.environ)
model = load(settings, os.environ, device).model
prompt = probe_prompt(model.cfg.vocab)
drafting = Drafting(2, 0.7, 32) if drafts_from_head(model) else None
print(f"device {device}, drafts {drafting is not None}", flush=True)


def dirty_allocator(seed: int) -> None:
    """The caching allocator's free blocks full of random bytes: what torch.empty hands out next."""
    if device.type != "cuda":
        return
    generator = torch.Generator(device).manual_seed(seed)
    free, _ = torch.cuda.mem_get_info(device)
    blocks = [torch.randint(0, 256, (1 << 28,), generator=generator, dtype=torch.uint8, device=device)
              for _ in range(min(8, int(free * 0.5) >> 28))]
    # and the small pool's (blocks up to 1 MiB, where a step's scratch lives), in sizes of its own
    blocks += [torch.randint(0, 256, (size,), generator=generator, dtype=torch.uint8, device=device)
               for size in (512, 4096, 65536, 1 << 19, 1 << 20) for _ in range(256)]
    del blocks  # kept by the allocator, contents and all


def others(runner, seed: int) -> None:
    """Requests of other lengths first, several at once, on the same runner; its kept states cleared."""
    generator = torch.Generator().manual_seed(seed)
    requests = [Request(f"other-{seed}-{i}", tuple(torch.randint(0, model.cfg.vocab, (int(n),), generator=generator)
                                                   .tolist()), 5, Sampling(temperature=1.0, seed=seed + i))
                for i, n in enumerate(torch.randint(3, 300, (4,), generator=generator))]
    drive(model, requests, 256, True, runner=runner, drafting=drafting)
    runner.cache.kept.clear()


def parts(fill: int | None, graphs: bool, mode: str = "pool") -> dict[str, str]:
    if mode == "allocator" and fill is not None:
        dirty_allocator(fill)
    runner = runner_for(model, 512, 4, graphs and device.type == "cuda", drafting, kept_states=4)
    if mode == "others" and fill is not None:
        others(runner, fill)
        fill = None
    pool = runner.pool
    raw = pool.buffer.view(torch.uint8)
    if fill is None:
        raw.zero_()
    else:
        generator = torch.Generator(device).manual_seed(fill)
        raw.copy_(torch.randint(0, 256, raw.shape, generator=generator, dtype=torch.uint8, device=device))
        pool.page_bytes_view(pool.null_page).zero_()
    drive(model, [Request("probe", prompt, 1, Sampling(temperature=0.0))], 256, graphs, runner=runner,
          drafting=drafting)
    state = runner.cache.kept.states.get(Prefixes(prompt).key_at(128))
    found = {}
    for name, view in sorted(state.pieces.items()):
        found[f"piece {name}"] = hashlib.sha256(view.contiguous().view(torch.uint8).cpu().numpy()).hexdigest()[:12]
    layout, rows = pool.layout, pool.layout.page_rows
    for part in layout.row_parts:
        for index, page in enumerate(state_pages(state)):
            end = min(state.position, (index + 1) * rows) - index * rows
            if end <= 0:
                continue
            base = page * layout.page_bytes + layout.part_offsets[part.name]
            chunk = pool.buffer[base:base + end // part.rows * part.entry_bytes]
            found[f"rows {part.name} page {index}"] = hashlib.sha256(chunk.cpu().numpy()).hexdigest()[:12]
    return found


for mode in ("pool", "allocator", "others"):
    for graphs in (False, True):
        first = parts(None, graphs)
        for fill in (1, 2, None):
            other = parts(fill, graphs, mode)
            moved = [name for name in first if first[name] != other.get(name)]
            print(f"{mode} graphs {graphs} fill {fill}: {len(moved)} of {len(first)} parts differ from a zeroed "
                  "pool's" + (f": {moved[:12]}" if moved else ""), flush=True)

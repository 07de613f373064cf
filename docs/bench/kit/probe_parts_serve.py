"""`python .dev/probe_parts_serve.py serve` (issue 36, identity_flake.sh): tfd serve, with the identity probe's digest logged part by
part (pieces by name, rows by part and page), so two starts show WHICH bytes of the kept state move."""
import hashlib, logging, sys
import tfd.engine.cache_face as face
from tfd.cache.image_bytes import piece_ranges, row_ranges, state_pages
from tfd.store.copies import host_bytes

log = logging.getLogger("tfd.probe-parts")
whole = face.state_digest

def state_digest(pool, state):
    for name, view in sorted(state.pieces.items()):
        log.warning("probe part piece %s %s", name, hashlib.sha256(host_bytes(piece_ranges([(name, view)])[0].cpu().contiguous())).hexdigest()[:12])
    pages, rows = state_pages(state), pool.layout.page_rows
    for part in pool.layout.row_parts:
        for i in range(len(pages)):
            end = min(state.position, (i + 1) * rows)
            if end <= i * rows:
                continue
            base = pages[i] * pool.layout.page_bytes + pool.layout.part_offsets[part.name]
            first, last = 0, (end - i * rows) // part.rows
            chunk = pool.buffer[base:base + last * part.entry_bytes]
            log.warning("probe part rows %s page %d %s", part.name, i, hashlib.sha256(host_bytes(chunk.cpu().contiguous())).hexdigest()[:12])
    return whole(pool, state)

face.state_digest = state_digest
from tfd.cli import main
sys.argv[0] = "tfd"
sys.exit(main())

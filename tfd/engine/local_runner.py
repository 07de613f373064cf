"""A runner on a pool of its own, for work driven on the calling thread: the bench and ``tfd generate``.

The daemon plans its pool from the device and the settings (``tfd.server.service``); these callers
know the lanes they will run, so the pool holds exactly those lanes' windows (and, when asked, room
for kept prompt states).
"""

from __future__ import annotations

from tfd.engine.rounds import Propose, drafts_from_head
from tfd.engine.runner import Drafting, Runner
from tfd.families.hybrid import HybridModel
from tfd.pool.pages import Pool

PAGE_ROWS = 64  # rows of a page, or the least multiple of it whose page holds a GDN state


def runner_for(model: HybridModel, window: int, streams: int, graphs: bool, drafting: Drafting | None = None,
               propose: Propose | None = None, kept_pages: int = 0, kept_states: int = 0,
               keep_gain: int = 0, kept_bytes: int | None = None) -> Runner:
    """A runner on a pool sized for ``streams`` lanes of ``window`` tokens, ``kept_pages`` more pages
    for kept prompt states and room for ``kept_states`` more (their pieces and a copied page; the
    rows they share with lanes are the lanes'): a prompt cache bounded by the pool, none without;
    ``keep_gain`` as TF_PROMPT_KEEP_GAIN; ``kept_bytes``: the cache's budget instead (0: no cache)."""
    device = model.weights.embed.device
    head = drafting is not None and drafts_from_head(model)
    verify = 1 + drafting.most if drafting is not None and head else 0  # rows a window takes at most
    smallest = model.layout(PAGE_ROWS, head, verify).smallest_page_rows()  # a page holds the largest piece
    layout = model.layout(-(-smallest // PAGE_ROWS) * PAGE_ROWS, head, verify)
    kept_pages += kept_states * (layout.state_pages + 1)
    pool = Pool(layout, streams * layout.need(window) + kept_pages, max_lanes=streams, device=device)
    if kept_bytes is None:  # the pool: a state's rows shared with a lane count against it too
        kept_bytes = pool.pages * layout.page_bytes if kept_pages else 0
    return Runner(model, pool, window, streams, graphs, drafting, propose, kept_bytes=kept_bytes,
                  keep_gain=keep_gain)

"""A tensor-parallel rank other than 0 (``python -m tfd.server.follower``, started by
``tfd.server.ranks.start``): it joins the group, loads its share of the model, builds its engine and
runs the steps rank 0 shares (``Engine.follow``) until rank 0's engine stops; its exit status is 0
then, 1 when its load or a step failed (logged, its rank named).

Signals: SIGTERM and SIGINT are ignored, since systemd and a terminal signal every process of the
daemon at once: rank 0 drains, then its engine shares the stop, and this process ends after its last
step. Rank 0 gone (killed), the next collective fails and this process exits 1.
"""

from __future__ import annotations

import logging
import signal
import sys

import torch.distributed as dist

from tfd.engine.engine import Engine
from tfd.engine.grammar import Grammar, Vocabulary
from tfd.engine.lockstep import Follower
from tfd.server.ranks import joined_rank, rank_of
from tfd.server.service import attach_mirror, prepare

log = logging.getLogger("tfd.ranks")


def main() -> int:
    """A rank process: join, load this rank's share, run the steps rank 0 shares; its exit status."""
    for signum in (signal.SIGTERM, signal.SIGINT):  # rank 0 drains, then shares the stop
        signal.signal(signum, signal.SIG_IGN)
    joining, control = joined_rank()
    try:
        parallel = rank_of(joining.settings, joining.rank, control)
        prepared = prepare(joining.settings, joining.environ, parallel)
        loaded = prepared.loaded
        vocabulary = Vocabulary(loaded.tokenizer.to_str(), loaded.model.cfg.vocab, loaded.eos_ids)
        follower = Follower(lambda text, lanes: Grammar.of_text(vocabulary, text, lanes), control)
        engine = Engine(loaded.model, loaded.tokenizer, prepared.pool, prepared.engine, lockstep=follower)
        engine.mirrors.update(attach_mirror(prepared, joining.environ, engine.drafts))  # its own store
        engine.follow()
    except Exception:
        log.exception("tensor parallel rank %d stopped", joining.rank)
        return 1
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

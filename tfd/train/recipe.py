"""What a training run of the demo is a function of: steps, batch, seq, lr, seed, and the fixed
rest of the recipe (optimizer, schedule, clipping, the MTP loss weight and target). No torch here, so the
command line reads its defaults without loading it.

The defaults are sized for one H200 (about 4 minutes of training); ``minutes`` stops a run at that
wall time whatever ``steps`` says, so a slower device still writes its checkpoint (the schedule is
then cut short, and training.json says so).
"""

from __future__ import annotations

import math

import attrs

from tfd.demo import SEED

# The command line's default wall-time limit: under the device runner's 10 minutes a command, with
# room for reading the corpus, the two validation passes and writing the checkpoint.
SAFETY_MINUTES = 8.0
MTP_TARGETS = ("data", "main")

@attrs.frozen
class Recipe:
    """What a run is a function of, and its fixed hyperparameters."""

    steps: int = 4000
    batch: int = 64
    seq: int = 512
    lr: float = 2e-3
    seed: int = SEED
    minutes: float | None = None  # a safety net: stop at this wall time, whatever ``steps`` says
    log_every: int = 50
    eval_windows: int = 512  # validation windows scored at the start and the end
    warmup_share: float = 0.05
    warmup_most: int = 200
    final_lr_share: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    clip: float = 1.0
    mtp_weight: float = 0.5
    # what the MTP head at t learns: the text's x_{t+2} ("data"), or the main model's own distribution
    # at t+1, detached ("main": a draft is kept when it is what the main model draws there; the shipped
    # demo's, whose acceptance it raised over "data" on the H200)
    mtp_target: str = "main"

    def __attrs_post_init__(self) -> None:
        for name in ("steps", "batch", "seq", "log_every", "eval_windows"):
            if getattr(self, name) < 1:
                raise ValueError(f"recipe {name} must be at least 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"recipe lr must be positive, got {self.lr}")
        if self.mtp_target not in MTP_TARGETS:
            raise ValueError(f"recipe mtp_target must be one of {', '.join(MTP_TARGETS)}, "
                             f"got {self.mtp_target!r}")
        if self.minutes is not None and not self.minutes > 0:
            raise ValueError(f"recipe minutes must be positive, got {self.minutes}")

    @property
    def warmup(self) -> int:
        return max(1, min(self.warmup_most, round(self.steps * self.warmup_share)))

    def rate(self, step: int) -> float:
        """The learning rate of step ``step`` (0-based): linear warmup, then cosine decay."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        done = (step - self.warmup) / max(1, self.steps - self.warmup)
        floor = self.final_lr_share
        return self.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, done))))

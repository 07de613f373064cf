"""The demo's training recipe: one function of (steps, batch, seq, lr, seed) over the corpus.

The model starts from the demo's own seeded random init (``tfd.demo.SEED``, drawn by
``tfd.families.random_weights``); ``seed`` draws the training windows. AdamW (betas 0.9/0.95,
weight decay on tensors of two or more dimensions only), linear warmup then cosine decay to a tenth
of the peak rate, gradients clipped to norm 1, bf16 autocast on CUDA over fp32 master weights. The
loss is the main model's cross-entropy plus half the MTP head's (both means over positions), the head
learning the text two ahead or, with ``mtp_target`` "main", the main model's own next distribution
(self-distillation, as speculative decoding's draft heads are trained: acceptance is agreement with
the main model, not with the text).

Only the data order and the init are fixed by the recipe: on a GPU, kernels that add with atomics
(embedding and attention backward) may give other low bits run to run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import attrs
import torch
import torch.nn.functional as F

from tfd.demo import DEMOS, SEED
from tfd.train.corpus import Corpus, Sampler, tiles
from tfd.train.evaluate import Scores, evaluate
from tfd.train.model import TrainModel
from tfd.train.recipe import Recipe

log = logging.getLogger("tfd.train")
DEMO = "qwen3_5"


@attrs.frozen
class Trained:
    """A finished run: the model and what it records in training.json."""

    model: TrainModel
    steps: int  # steps taken (fewer than the recipe's when ``minutes`` ran out)
    seconds: float
    history: list[dict[str, float]]  # one entry per log line
    before: Scores
    after: Scores


def optimizer(model: TrainModel, recipe: Recipe, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (and the conv and embedding tables), none on norms,
    decay rates and biases."""
    params = model.params.values()
    groups = [{"params": [t for t in params if t.ndim >= 2], "weight_decay": recipe.weight_decay},
              {"params": [t for t in params if t.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=recipe.lr, betas=recipe.betas, fused=device.type == "cuda")


def train(recipe: Recipe, corpus: Corpus, device: torch.device,
          config: Mapping[str, Any] | None = None) -> Trained:
    """Train the demo (or ``config``'s model) from its seeded init on ``corpus``.

    Resource handling: the corpus stays on the CPU; one batch of windows moves to ``device`` a
    step. Logs a line every ``recipe.log_every`` steps (the only host syncs of the loop). Raises
    ``ValueError`` naming a split too short for one window.
    """
    config = DEMOS[DEMO][1] if config is None else config
    model = TrainModel.random(config, SEED, device)
    length = recipe.seq + 2  # a position t reads x_t, learns x_{t+1}, and its head x_{t+2}
    sampler = Sampler(corpus.train, recipe.batch, length, recipe.seed)
    held_out = tiles(corpus.validation, length, recipe.eval_windows)
    before = evaluate(model, held_out, recipe.batch, device)
    log.info("step 0: validation lm loss %.4f, mtp loss %.4f", before.lm_loss, before.mtp_loss)
    adamw = optimizer(model, recipe, device)
    params = list(model.params.values())
    progress = Progress(recipe, device)
    step = 0
    while step < recipe.steps:
        if recipe.minutes is not None and progress.elapsed() > 60 * recipe.minutes:
            log.warning("stopping at step %d of %d: %.1f minutes are up", step, recipe.steps, recipe.minutes)
            break
        for group in adamw.param_groups:
            group["lr"] = recipe.rate(step)
        windows = sampler.draw().to(device, non_blocking=True)
        lm, mtp = losses(model, windows, device, recipe.mtp_target)
        torch.autograd.backward(lm + recipe.mtp_weight * mtp)
        torch.nn.utils.clip_grad_norm_(params, recipe.clip)
        adamw.step()
        adamw.zero_grad(set_to_none=True)
        progress.add(lm, mtp)
        step += 1
        if step % recipe.log_every == 0:
            progress.report(step)
    progress.report(step)  # the steps since the last line, if any
    seconds = progress.elapsed()
    after = evaluate(model, held_out, recipe.batch, device)
    log.info("validation after %d steps: lm loss %.4f, mtp top-1 %.3f, mtp sure %.3f", step, after.lm_loss,
             after.mtp_top1, after.mtp_confident)
    return Trained(model, step, seconds, progress.history, before, after)


def losses(model: TrainModel, windows: torch.Tensor, device: torch.device, target: str = "data"
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The main model's and the MTP head's mean cross-entropy over ``windows`` [batch, seq + 2]: the
    head's against x_{t+2} (``target`` "data") or against the main model's distribution at t + 1,
    no gradient through it ("main"; a window's last position has no main row after it)."""
    ids, nexts, afters = windows[:, :-2], windows[:, 1:-1], windows[:, 2:]
    with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
        out = model.forward(ids, nexts)
    assert out.draft_logits is not None
    logits = out.logits.float()
    lm = F.cross_entropy(logits.flatten(0, 1), nexts.flatten())
    if target == "main":
        wanted = torch.softmax(logits[:, 1:].detach(), dim=-1)
        drafted = torch.log_softmax(out.draft_logits[:, :-1].float(), dim=-1)
        return lm, -(wanted * drafted).sum(dim=-1).mean()
    mtp = F.cross_entropy(out.draft_logits.float().flatten(0, 1), afters.flatten())
    return lm, mtp


class Progress:
    """Running sums of the losses on the device, read (a host sync) only when a line is logged."""

    def __init__(self, recipe: Recipe, device: torch.device) -> None:
        self.recipe = recipe
        self.sums = torch.zeros(2, device=device)
        self.history: list[dict[str, float]] = []
        self.began = self.last = time.monotonic()
        self.logged = 0  # the step of the last line

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def add(self, lm: torch.Tensor, mtp: torch.Tensor) -> None:
        self.sums += torch.stack((lm.detach(), mtp.detach()))

    def report(self, step: int) -> None:
        """Log the mean losses and the speed of the steps since the last line."""
        done = step - self.logged
        if done < 1:
            return
        lm, mtp = (self.sums / done).tolist()
        now = time.monotonic()
        entry = {"step": step, "loss": lm, "mtp_loss": mtp, "lr": self.recipe.rate(step - 1),
                 "tokens_per_s": done * self.recipe.batch * self.recipe.seq / (now - self.last),
                 "seconds": now - self.began}
        self.history.append(entry)
        log.info("step %d: loss %.4f, mtp loss %.4f, lr %.2e, %.0f tok/s", step, lm, mtp, entry["lr"],
                 entry["tokens_per_s"])
        self.sums.zero_()
        self.last, self.logged = now, step

"""How well a model in training predicts held-out text, and how often its MTP head's drafts would
be taken.

The head's top-1 accuracy (its argmax at t equals x_{t+2}) is a proxy for draft acceptance on
text like the corpus; its agreement with the main model's own argmax at t+1 is the closer proxy for
greedy serving, where a draft is kept when the main model would have produced it. The share of
positions where the head's top probability reaches ``CONFIDENT`` says how often a chain of drafts
would go on (``tfd.engine.proposer`` chains while the draft before was that sure).
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

from tfd.train.model import TrainModel

CONFIDENT = 0.7


@attrs.frozen
class Scores:
    """Means over every scored position of the validation windows."""

    lm_loss: float
    mtp_loss: float
    lm_top1: float  # the main model's argmax at t equals x_{t+1}
    mtp_top1: float  # the head's argmax at t equals x_{t+2}
    mtp_agrees: float  # the head's argmax at t equals the main model's argmax at t+1
    mtp_confident: float  # the head's top probability at t is at least CONFIDENT
    mtp_confident_top1: float  # of those, the share whose argmax equals x_{t+2}
    positions: int


def evaluate(model: TrainModel, windows: torch.Tensor, batch: int, device: torch.device) -> Scores:
    """Scores of ``model`` over ``windows`` [n, time + 2] (int64, CPU), ``batch`` windows a pass.

    Resource handling: no gradients; one batch's logits (two [batch, time, vocab] fp32 tensors)
    live at a time; under bf16 autocast on CUDA as in training.
    """
    sums = torch.zeros(8, dtype=torch.float64, device=device)
    with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
        for part in torch.split(windows, batch):
            part = part.to(device)
            ids, nexts, afters = part[:, :-2], part[:, 1:-1], part[:, 2:]
            out = model.forward(ids, nexts)
            assert out.draft_logits is not None
            logits, drafts = out.logits.float(), out.draft_logits.float()
            best, guess = torch.softmax(drafts, dim=-1).max(dim=-1)
            confident = best >= CONFIDENT
            main = logits.argmax(dim=-1)
            sums += torch.stack([
                F.cross_entropy(logits.flatten(0, 1), nexts.flatten(), reduction="sum").double(),
                F.cross_entropy(drafts.flatten(0, 1), afters.flatten(), reduction="sum").double(),
                (main == nexts).sum().double(),
                (guess == afters).sum().double(),
                (guess[:, :-1] == main[:, 1:]).sum().double(),
                confident.sum().double(),
                (confident & (guess == afters)).sum().double(),
                torch.tensor(float(ids.numel()), dtype=torch.float64, device=device)])
    totals = sums.tolist()
    positions = totals[7]
    agreeable = positions - windows.shape[0]  # the last position of a window has no main row after it
    return Scores(lm_loss=totals[0] / positions, mtp_loss=totals[1] / positions,
                  lm_top1=totals[2] / positions, mtp_top1=totals[3] / positions,
                  mtp_agrees=totals[4] / agreeable, mtp_confident=totals[5] / positions,
                  mtp_confident_top1=totals[6] / totals[5] if totals[5] else 0.0, positions=int(positions))

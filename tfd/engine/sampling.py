"""Keyed sampling on the device: Gumbel-max with noise hashed from (seed, position, token).

A token at absolute position p of a request with seed s is argmax over the allowed tokens t of
logits_t / temperature + G(s, p, t), where G is Gumbel noise computed from a hash, not drawn from
a generator. So a row draws the same token alone or in any batch, and a verify row later draws
what serial decoding would have drawn at that position. Temperature 0 is greedy (ties go to the
lower token id). A request's logit bias is added to its logits first, then its penalties, then a
grammar's mask bars the tokens it does not allow; top-k, top-p and min-p cut the tempered
distribution before the draw; ties in probability keep the lower token id first. Every
step is a per-row operation, row-invariant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import torch

from tfd.engine import grammar_masks
from tfd.engine.request import Sampling, TokenLogprob
from tfd.model.memory import to_device
from tfd_kernels import sampling as keyed


def _signed(value: int) -> int:
    """A 64-bit constant as torch's int64 holds it."""
    return value - (1 << 64) if value >= 1 << 63 else value


_SEED_MIX, _POSITION_MIX, _TOKEN_MIX, _M1, _M2 = (_signed(value) for value in (
    keyed.SEED_MIX, keyed.POSITION_MIX, keyed.TOKEN_MIX, keyed.M1, keyed.M2))


def _shift(x: torch.Tensor, bits: int) -> torch.Tensor:
    """A logical right shift of int64 (torch shifts arithmetically)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def gumbel(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Noise [rows, vocab] in fp32 for int64 ``seeds`` and ``positions`` [rows]."""
    tokens = torch.arange(vocab, dtype=torch.int64, device=seeds.device)
    x = seeds[:, None] * _SEED_MIX + positions[:, None] * _POSITION_MIX + tokens[None, :] * _TOKEN_MIX
    x = (x ^ _shift(x, 30)) * _M1  # splitmix64's finaliser, wrapping in int64
    x = (x ^ _shift(x, 27)) * _M2
    x = x ^ _shift(x, 31)
    # 23 bits and a half: exact in fp32, 2^-24 to 1 - 2^-24. Of 24 bits the top one rounded to 1.0, whose
    # noise is +inf: a token certain to win at 1.5% of a 248k vocabulary's rows, NaN where it was barred
    uniform = (_shift(x, 41).float() + 0.5) * (1.0 / (1 << 23))
    return -torch.log(-torch.log(uniform))


def plain(setting: Sampling) -> bool:
    """Whether a request's draws cut nothing: no top-k, top-p or min-p (top_p >= 1 is off)."""
    return setting.top_k <= 0 and setting.top_p >= 1.0 and setting.min_p <= 0.0


def barring(setting: Sampling, tokens: Sequence[int]) -> Sampling:
    """``setting`` with ``tokens`` never drawn (a bias of minus infinity)."""
    return attrs.evolve(setting, bias=setting.bias + tuple((token, float("-inf")) for token in tokens))


def penalized(setting: Sampling) -> bool:
    """Whether a request's draws read its earlier tokens (a penalty off its neutral value)."""
    return setting.frequency_penalty != 0.0 or setting.presence_penalty != 0.0 or \
        setting.repetition_penalty != 1.0


def drawn_by_step(setting: Sampling) -> bool:
    """Whether the keyed draw a decode step makes of its logits is this request's draw: ``plain``,
    no logit bias, no penalty."""
    return plain(setting) and not setting.bias and not penalized(setting)


@attrs.frozen
class History:
    """What a row's penalties read: the tokens drawn before it (token: times) and its prompt's
    distinct tokens."""

    drawn: Mapping[int, int]
    prompt: frozenset[int]


@attrs.frozen
class Rows:
    """The sampling settings of each row, as tensors on the device."""

    temperature: torch.Tensor  # fp32 [rows]; 0: greedy
    top_k: torch.Tensor  # int64 [rows]; 0: off
    top_p: torch.Tensor  # fp32 [rows]; 1 or more: off
    min_p: torch.Tensor  # fp32 [rows]
    seeds: torch.Tensor  # int64 [rows]
    positions: torch.Tensor  # int64 [rows]: the absolute position of the token drawn
    plain: bool  # no row cuts anything: the draw needs no sort
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # rows, tokens, fp32 values
    # rows, tokens, times drawn, fp32 [rows] frequency, presence and repetition penalties
    penalties: tuple[torch.Tensor, ...] | None = None
    allowed: torch.Tensor | None = None  # int32 [rows, words]: the tokens grammars let each row draw


    @classmethod
    def of(cls, settings: Sequence[Sampling], seeds: Sequence[int], positions: Sequence[int],
           device: torch.device, histories: Sequence[History | None] | None = None,
           allowed: torch.Tensor | None = None) -> Rows:
        """Two host-to-device copies, the settings and the keys (pinned, not waited on, on CUDA),
        and one or two more for the rows that bias or penalize (``histories``: each row's, needed
        where a row penalizes), one for the rows grammars mask (``allowed``: ``grammar_masks.allowed``'s)."""
        fields = torch.tensor([[s.temperature for s in settings], [s.top_k for s in settings],
                               [s.top_p for s in settings], [s.min_p for s in settings]],
                              dtype=torch.float64).reshape(4, len(settings))
        keys = torch.tensor([list(seeds), list(positions)], dtype=torch.int64).reshape(2, len(settings))
        fields, keys = to_device(fields, device), to_device(keys, device)
        bias = None
        entries = [(row, token, value) for row, s in enumerate(settings) for token, value in s.bias]
        if entries:
            where = to_device(torch.tensor([[row, token] for row, token, _ in entries], dtype=torch.int64).T
                              .contiguous(), device)
            bias = (where[0], where[1], to_device(torch.tensor([value for *_, value in entries],
                                                               dtype=torch.float32), device))
        return cls(fields[0].float(), fields[1].long(), fields[2].float(), fields[3].float(),
                   keys[0], keys[1], all(plain(setting) for setting in settings), bias,
                   _penalties(settings, histories, device),
                   None if allowed is None else to_device(allowed, device))


def draw(logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor,
         positions: torch.Tensor, offset: int = 0, out: torch.Tensor | None = None,
         out_rows: torch.Tensor | None = None, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """argmax of logits / temperature + noise (greedy rows: of the logits), a row at a time, each
    row keyed at its position plus ``offset``, into ``out`` when given (row r at ``out_rows[r]`` with
    those, none below 0): the one-pass kernel on CUDA, its torch form elsewhere. Cut tokens come in
    as -inf; so do those a row's grammar bars (``allowed``: ``grammar_masks.allowed``'s bitmask on the
    logits' device); 2-byte logits are drawn as their fp32 values; temperature is fp32, or int64
    fields holding its fp32 bits (a decode batch's)."""
    if logits.is_cuda:
        return keyed.keyed_argmax(logits, temperature, seeds, positions, offset, out, out_rows, allowed)
    if temperature.dtype == torch.int64:
        temperature = temperature.to(torch.int32).view(torch.float32)
    logits, positions = logits.float(), positions + offset
    if allowed is not None:
        logits = grammar_masks.apply(logits, allowed)
    greedy = temperature <= 0
    noise = gumbel(seeds, positions, logits.shape[-1])
    scores = logits / torch.where(greedy, 1.0, temperature)[:, None] + noise
    tokens = torch.where(greedy, logits.argmax(dim=-1), scores.argmax(dim=-1))
    if out is None:
        return tokens
    if out_rows is None:
        return out.copy_(tokens)
    kept = out_rows >= 0
    out[out_rows[kept]] = tokens[kept]
    return out


def sample(logits: torch.Tensor, rows: Rows) -> torch.Tensor:
    """One token per row of ``logits`` [rows, vocab] (fp32, or 2-byte drawn as their fp32 values; a
    bias, penalties and grammars' masks go to an fp32 copy, in that order; a draw that cuts nothing
    reads the masks as it draws, with no copy)."""
    if rows.bias is not None or rows.penalties is not None or not rows.plain:
        logits = logits.float()
    if rows.bias is not None:
        logits = logits.index_put((rows.bias[0], rows.bias[1]), rows.bias[2], accumulate=True)
    if rows.penalties is not None:
        logits = _penalize(logits, *rows.penalties)
    if rows.plain:
        return draw(logits, rows.temperature, rows.seeds, rows.positions, allowed=rows.allowed)
    if rows.allowed is not None:
        logits = grammar_masks.apply(logits, rows.allowed)
    vocab = logits.shape[-1]
    greedy = rows.temperature <= 0
    tempered = logits / torch.where(greedy, 1.0, rows.temperature)[:, None]
    probs = torch.softmax(tempered, dim=-1)
    order = torch.sort(probs, dim=-1, descending=True, stable=True)
    ranked = order.values
    rank = torch.empty_like(order.indices).scatter_(-1, order.indices, torch.arange(
        vocab, device=logits.device).expand_as(order.indices))
    keep = (rows.top_k[:, None] <= 0) | (rank < rows.top_k[:, None])  # greedy's pick is never cut
    before = ranked.cumsum(dim=-1) - ranked  # mass of the better tokens
    # the best token always stays (a top_p that rounds to 0 in fp32 keeps it alone)
    nucleus = (before < rows.top_p[:, None]) | (torch.arange(vocab, device=logits.device) == 0)
    keep &= torch.empty_like(keep).scatter_(-1, order.indices, nucleus) | (rows.top_p[:, None] >= 1.0)
    keep &= probs >= rows.min_p[:, None] * ranked[:, :1]
    return draw(torch.where(keep, logits, float("-inf")), rows.temperature, rows.seeds, rows.positions)


def _penalties(settings: Sequence[Sampling], histories: Sequence[History | None] | None,
               device: torch.device) -> tuple[torch.Tensor, ...] | None:
    """The penalized rows' (row, token, times drawn) entries, every token of their prompt or drawn
    before, and each row's three penalties; None when no row penalizes."""
    if not any(penalized(setting) for setting in settings):
        return None
    assert histories is not None and len(histories) == len(settings), "a penalized row needs its history"
    entries = []
    for row, (setting, history) in enumerate(zip(settings, histories, strict=True)):
        if penalized(setting):
            assert history is not None
            tokens = set(history.drawn) | (history.prompt if setting.repetition_penalty != 1.0 else set())
            entries += [(row, token, history.drawn.get(token, 0)) for token in sorted(tokens)]
    if not entries:
        return None
    where = to_device(torch.tensor(entries, dtype=torch.int64).T.contiguous(), device)
    values = to_device(torch.tensor([[s.frequency_penalty, s.presence_penalty, s.repetition_penalty]
                                     for s in settings], dtype=torch.float32).T.contiguous(), device)
    return where[0], where[1], where[2], values[0], values[1], values[2]


def _penalize(logits: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor, times: torch.Tensor,
              frequency: torch.Tensor, presence: torch.Tensor, repetition: torch.Tensor) -> torch.Tensor:
    """A copy of ``logits`` with each (row, token) entry penalized: the repetition penalty first
    (divided when positive, multiplied when not), then frequency times the draws and presence once
    drawn."""
    values = logits[rows, tokens]
    scale = repetition[rows]
    values = torch.where(values > 0, values / scale, values * scale)
    values = values - frequency[rows] * times - presence[rows] * (times > 0)
    return logits.index_put((rows, tokens), values)


def logprobs(logits: torch.Tensor, tokens: torch.Tensor, top: int) -> list[TokenLogprob]:
    """The chosen tokens' log-probabilities under the model (untempered) and the ``top`` best."""
    values = torch.log_softmax(logits.float(), dim=-1)
    chosen = values.gather(-1, tokens[:, None])[:, 0].tolist()
    best = torch.sort(values, dim=-1, descending=True, stable=True)
    ids, scores = best.indices[:, :top].tolist(), best.values[:, :top].tolist()
    return [TokenLogprob(int(token), float(value), tuple(zip(row_ids, row_scores, strict=True)))
            for token, value, row_ids, row_scores in zip(tokens.tolist(), chosen, ids, scores, strict=True)]

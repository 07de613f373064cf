"""Keyed sampling: the same key draws the same token, alone or in a batch, in the right proportions."""

from __future__ import annotations

import math

import torch
from keyed_noise import seed_hashing_to

from tfd.engine.request import Sampling
from tfd.engine.sampling import History, Rows, _penalize, draw, gumbel, logprobs, sample

VOCAB = 50


def rows(settings: list[Sampling], seeds: list[int], positions: list[int]) -> Rows:
    return Rows.of(settings, seeds, positions, torch.device("cpu"))


def test_noise_is_a_function_of_seed_position_and_token() -> None:
    a = gumbel(torch.tensor([1, 1, 2]), torch.tensor([5, 6, 5]), VOCAB)
    b = gumbel(torch.tensor([2, 1]), torch.tensor([5, 5]), VOCAB)
    assert torch.equal(a[0], b[1]) and torch.equal(a[2], b[0])
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[0], a[2])
    assert torch.isfinite(a).all()


def test_the_noise_is_finite_at_both_ends_of_the_hash_and_a_barred_token_never_draws() -> None:
    # the hash's top bits all ones once made the uniform 1.0 and its noise +inf (NaN beside a barred -inf)
    ends = [seed_hashing_to(0), seed_hashing_to((1 << 64) - 1)]
    noise = gumbel(torch.tensor(ends), torch.tensor([0, 0]), 1)
    assert torch.isfinite(noise).all() and noise[0, 0] < noise[1, 0]
    only_one = torch.tensor([[0b10]], dtype=torch.int32)  # token 1 allowed, token 0 (the top noise) barred
    logits = torch.tensor([[0.0, -3.0]])
    for allowed in (only_one, None):
        drawn = draw(logits, torch.ones(1), torch.tensor(ends[1:]), torch.zeros(1, dtype=torch.int64),
                     allowed=allowed)
        assert drawn.tolist() == ([1] if allowed is not None else [0])


def test_a_row_draws_the_same_alone_and_in_any_batch() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(12, VOCAB, generator=generator) * 3
    settings = [Sampling(temperature=t, top_p=p, top_k=k, min_p=m) for t, p, k, m in
                [(0.0, 1.0, 0, 0.0), (0.8, 0.9, 0, 0.0), (1.0, 1.0, 5, 0.0), (1.3, 0.5, 0, 0.1)] * 3]
    seeds, positions = list(range(12)), [100 + i for i in range(12)]
    together = sample(logits, rows(settings, seeds, positions))
    alone = torch.cat([sample(logits[i:i + 1], rows(settings[i:i + 1], seeds[i:i + 1], positions[i:i + 1]))
                       for i in range(12)])
    assert torch.equal(together, alone)


def test_greedy_takes_the_best_and_the_lower_id_on_a_tie() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, [7, 3]] = 5.0
    assert sample(logits, rows([Sampling(temperature=0.0)], [1], [0])).item() == 3


def test_draws_follow_the_distribution() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(4000, -1).contiguous()
    settings = [Sampling(temperature=1.0)] * 4000
    drawn = sample(logits, rows(settings, list(range(4000)), [9] * 4000))
    counts = torch.bincount(drawn, minlength=4).float() / 4000
    assert torch.allclose(counts, probs, atol=0.03), counts


def test_top_k_top_p_and_min_p_cut_the_tail() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(2000, -1).contiguous()
    for setting, allowed in ((Sampling(top_k=2), {0, 1}), (Sampling(top_p=0.7), {0, 1}),
                             (Sampling(top_p=0.85), {0, 1, 2}), (Sampling(min_p=0.5), {0, 1})):
        drawn = sample(logits, rows([setting] * 2000, list(range(2000)), [1] * 2000))
        assert set(drawn.tolist()) == allowed, setting


def test_a_top_p_too_small_for_fp32_keeps_the_best_token_alone() -> None:
    probs = torch.tensor([0.3, 0.5, 0.15, 0.05])  # the best is not token 0, what an all-cut row would draw
    logits = probs.log().expand(500, -1).contiguous()
    for top_p, allowed in ((1e-300, {1}), (1e-30, {1}), (0.6, {0, 1})):  # 1e-300 is 0 in fp32; 1e-30 is not
        drawn = sample(logits, rows([Sampling(top_p=top_p)] * 500, list(range(500)), [1] * 500))
        assert set(drawn.tolist()) == allowed, top_p


def test_logprobs_are_the_models_and_ranked() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, 1.0]])
    entry = logprobs(logits, torch.tensor([1]), 3)[0]
    norm = math.log(sum(math.exp(v) for v in (2.0, 1.0, 0.0, 1.0)))
    assert math.isclose(entry.logprob, 1.0 - norm, rel_tol=1e-6)
    assert [token for token, _ in entry.top] == [0, 1, 3]  # tied 1 and 3: the lower id first


def test_a_bias_moves_the_draw_on_the_plain_and_the_cut_paths_and_leaves_the_logits() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(2000, -1).contiguous()
    before = logits.clone()
    for cut in (Sampling(), Sampling(top_k=3)):  # no sort, and the sorted cut
        pushed = Sampling(cut.temperature, cut.top_p, cut.top_k, bias=((3, 100.0),))
        assert set(sample(logits, rows([pushed] * 2000, list(range(2000)), [1] * 2000)).tolist()) == {3}
        barred = Sampling(cut.temperature, cut.top_p, cut.top_k, bias=((0, -100.0), (1, -100.0)))
        assert set(sample(logits, rows([barred] * 2000, list(range(2000)), [1] * 2000)).tolist()) <= {2, 3}
    assert torch.equal(logits, before)  # the caller's logits (logprobs read them) are not touched
    # a bias on some rows only: the others draw as without it
    mixed = [Sampling(bias=((3, 100.0),)) if i % 2 else Sampling() for i in range(8)]
    drawn = sample(logits[:8], rows(mixed, list(range(8)), [1] * 8))
    plain = sample(logits[:8], rows([Sampling()] * 8, list(range(8)), [1] * 8))
    assert drawn[1::2].tolist() == [3] * 4 and torch.equal(drawn[0::2], plain[0::2])


def test_penalties_read_the_rows_own_history_only() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0], [2.0, -1.0, 0.5, 3.0]])
    before = logits.clone()
    penalized = Sampling(temperature=0.0, frequency_penalty=0.5, presence_penalty=0.25,
                         repetition_penalty=2.0)
    histories = [History({0: 2, 1: 1}, frozenset({2})), None]
    found = Rows.of([penalized, Sampling(temperature=0.0)], [1, 2], [0, 0], torch.device("cpu"), histories)
    assert found.penalties is not None
    out = _penalize(logits, *found.penalties)
    # token 0: 2 / 2 - 0.5 * 2 - 0.25 = -0.25; token 1: -1 * 2 - 0.5 - 0.25 = -2.75; token 2 (prompt
    # only): 0.5 / 2 = 0.25; token 3 untouched; the second row untouched
    assert torch.allclose(out[0], torch.tensor([-0.25, -2.75, 0.25, 3.0]))
    assert torch.equal(out[1], before[1]) and torch.equal(logits, before)
    assert sample(logits, found).tolist() == [3, 3]
    barred = Sampling(temperature=0.0, presence_penalty=2.0)  # token 3 drawn before: 3 - 2 = 1 < 2
    assert sample(logits[:1], Rows.of([barred], [1], [0], torch.device("cpu"),
                                      [History({3: 1}, frozenset())])).tolist() == [0]
    neutral = Sampling(temperature=0.0, frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0)
    assert Rows.of([neutral], [1], [0], torch.device("cpu")).penalties is None
